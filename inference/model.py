"""What a caller of the engine loads: the base checkpoint (prepared on first use when it is the
default), the MedTPE artefact, and in `medtpe` mode the exported checkpoint (written when missing
or stale). `load_model(ModelConfig(...))` is the one entry point of the service, the evaluation
and the benchmarks.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from inference.engine import EngineConfig, EngineOptions
from inference.predictor import Mode, Predictor
from medtpe_core.bundle import ArtefactBundle, content_digest, unvalidated_budget_message
from medtpe_core.chat_template import ChatTemplate
from medtpe_core.meds_readers import read_code_descriptions
from medtpe_core.paths import default_artefact_dir, default_export_dir, default_model_dir
from medtpe_core.tokenizer import MedTPETokenizer
from medtpe_core.windowing import SLIDING_WINDOW, Windowing

logger = logging.getLogger(__name__)

EXPORT_STAMP = ".medtpe-source"
"""File in an export directory naming the digest of the artefact it was exported from."""


@dataclass(frozen=True)
class ModelConfig:
    """Which model, artefact and mode to load, the prompt budget and the engine's options."""

    model_dir: Path = field(default_factory=default_model_dir)
    """Base Hugging Face checkpoint (the default one is converted on first use)."""
    artefact_dir: Path = field(default_factory=default_artefact_dir)
    export_dir: Path = field(default_factory=default_export_dir)
    """Where the base + MedTPE rows checkpoint is exported (`medtpe` mode)."""
    mode: Mode = "medtpe"
    codes_dir: Path | None = None
    """MEDS dataset root with `metadata/codes.parquet` (None: the artefact directory's)."""
    max_input_tokens: int = 8192
    """Input budget in original-tokenizer tokens (shrunk to fit the model's context)."""
    max_new_tokens: int = 64
    windowing: Windowing = SLIDING_WINDOW
    """Which events of a record over the budget the prompt shows (`medtpe_core.windowing`)."""
    engine: EngineOptions = field(default_factory=EngineOptions)


@dataclass(frozen=True)
class ModelIdentity:
    """Which model and artefact answer: returned with every prediction (no filesystem path)."""

    name: str
    mode: str
    artefact_id: str
    base_fingerprint: str


@dataclass(frozen=True)
class LoadedModel:
    """Everything a service instance needs besides the running engine."""

    identity: ModelIdentity
    engine_config: EngineConfig
    predictor: Predictor
    bundle: ArtefactBundle
    """The MedTPE artefact, with the input budgets its fidelity gate passed at."""

    def unvalidated_budget(self) -> str | None:
        """Why this model's input budget is untested for MedTPE (None: validated, or the
        `original` mode, which does not use the artefact's rows)."""
        if self.identity.mode != "medtpe":
            return None
        return unvalidated_budget_message(self.bundle, self.predictor.max_input_tokens)


def ensure_base_model(model_dir: Path) -> Path:
    """The base checkpoint; the default one is converted on first use (training layer)."""
    if Path(model_dir).resolve() == default_model_dir().resolve():
        from training.default_model import prepare_default_model

        return prepare_default_model(model_dir)
    if not (Path(model_dir) / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a Hugging Face checkpoint (no config.json)")
    return Path(model_dir)


def ensure_export(model_dir: Path, artefact_dir: Path, export_dir: Path) -> Path:
    """The exported checkpoint of this base and artefact, exported now if missing or stale."""
    digest = content_digest(artefact_dir)
    stamp = Path(export_dir) / EXPORT_STAMP
    if stamp.is_file() and stamp.read_text().strip() == digest:
        return Path(export_dir)
    from training.export import export_checkpoint

    logger.info("exporting %s onto %s into %s", artefact_dir, model_dir, export_dir)
    export_checkpoint(Path(model_dir), Path(artefact_dir), Path(export_dir))
    stamp.write_text(digest + "\n")
    return Path(export_dir)


def model_context_length(model_dir: Path) -> int | None:
    """`max_position_embeddings` of a Hugging Face checkpoint, if its config declares one."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    value = config.get("max_position_embeddings")
    return int(value) if value else None


def input_budget(config: ModelConfig, checkpoint: Path) -> int:
    """Prompt tokens allowed: the configured budget, shrunk so the answer fits the context."""
    context = model_context_length(checkpoint)
    if context is None:
        return config.max_input_tokens
    return min(config.max_input_tokens, context - config.max_new_tokens)


def load_model(config: ModelConfig) -> LoadedModel:
    """Prepare and load the model files of `config` (blocking: minutes on a first start)."""
    base_dir = ensure_base_model(config.model_dir)
    bundle = ArtefactBundle.from_pretrained(config.artefact_dir)
    tokenizer = MedTPETokenizer.load(config.artefact_dir, base=base_dir)
    if config.mode == "medtpe":
        checkpoint = ensure_export(base_dir, config.artefact_dir, config.export_dir)
    else:
        checkpoint = base_dir
    budget = input_budget(config, checkpoint)
    predictor = Predictor(
        tokenizer,
        ChatTemplate.from_model_dir(base_dir),
        config.mode,
        budget,
        read_code_descriptions(config.codes_dir or config.artefact_dir),
        windowing=config.windowing,
    )
    engine_config = EngineConfig(checkpoint, budget + config.max_new_tokens, config.engine)
    identity = ModelIdentity(
        name=base_dir.name,
        mode=config.mode,
        artefact_id=tokenizer.artefact_id,
        base_fingerprint=tokenizer.fingerprint,
    )
    predictor.stop_ids  # noqa: B018 - the stop rule's ids, computed once here, not in a request
    return LoadedModel(identity, engine_config, predictor, bundle)
