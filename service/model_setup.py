"""What the service loads: the base checkpoint (prepared on first start when it is the default),
the MedTPE artefact, and in `medtpe` mode the exported checkpoint (written when missing or stale).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

from medtpe_core.chat_template import ChatTemplate
from medtpe_core.meds_readers import read_code_descriptions
from medtpe_core.paths import default_model_dir
from medtpe_core.tokenizer import MedTPETokenizer
from service.engine import EngineConfig, model_context_length
from service.pipeline import Predictor
from service.settings import ServiceSettings

logger = logging.getLogger(__name__)

EXPORT_STAMP = ".medtpe-source"
"""File in an export directory naming the digest of the artefact it was exported from."""
_ARTEFACT_FILES = ("medtpe.json", "embeddings.safetensors")


@dataclass(frozen=True)
class ModelIdentity:
    """Which model and artefact answer: returned with every prediction."""

    name: str
    path: str
    mode: str
    artefact_id: str
    base_fingerprint: str


@dataclass(frozen=True)
class LoadedModel:
    """Everything a service instance needs besides the running engine."""

    identity: ModelIdentity
    engine_config: EngineConfig
    predictor: Predictor


def ensure_base_model(model_dir: Path) -> Path:
    """The base checkpoint; the default one is converted on first use (training layer)."""
    if Path(model_dir).resolve() == default_model_dir().resolve():
        from training.default_model import prepare_default_model

        return prepare_default_model(model_dir)
    if not (Path(model_dir) / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a Hugging Face checkpoint (no config.json)")
    return Path(model_dir)


def artefact_digest(artefact_dir: Path) -> str:
    """sha256 over the artefact's merge table and trained rows."""
    digest = hashlib.sha256()
    for name in _ARTEFACT_FILES:
        digest.update(name.encode())
        digest.update((Path(artefact_dir) / name).read_bytes())
    return digest.hexdigest()


def ensure_export(model_dir: Path, artefact_dir: Path, export_dir: Path) -> Path:
    """The exported checkpoint of this base and artefact, exported now if missing or stale."""
    digest = artefact_digest(artefact_dir)
    stamp = Path(export_dir) / EXPORT_STAMP
    if stamp.is_file() and stamp.read_text().strip() == digest:
        return Path(export_dir)
    from training.export import export_checkpoint

    logger.info("exporting %s onto %s into %s", artefact_dir, model_dir, export_dir)
    export_checkpoint(Path(model_dir), Path(artefact_dir), Path(export_dir))
    stamp.write_text(digest + "\n")
    return Path(export_dir)


def input_budget(settings: ServiceSettings, checkpoint: Path) -> int:
    """Prompt tokens allowed: the configured budget, shrunk so the answer fits the context."""
    context = model_context_length(checkpoint)
    if context is None:
        return settings.max_input_tokens
    return min(settings.max_input_tokens, context - settings.max_new_tokens)


def load_model(settings: ServiceSettings) -> LoadedModel:
    """Prepare and load the model files of `settings` (blocking: minutes on a first start)."""
    base_dir = ensure_base_model(settings.model_dir)
    tokenizer = MedTPETokenizer.load(settings.artefact_dir, base=base_dir)
    if settings.mode == "medtpe":
        checkpoint = ensure_export(base_dir, settings.artefact_dir, settings.export_dir)
    else:
        checkpoint = base_dir
    budget = input_budget(settings, checkpoint)
    predictor = Predictor(
        tokenizer,
        ChatTemplate.from_model_dir(base_dir),
        settings.mode,
        budget,
        read_code_descriptions(settings.codes_dir or settings.artefact_dir),
    )
    engine_config = EngineConfig(
        model_dir=checkpoint,
        max_model_len=budget + settings.max_new_tokens,
        max_num_seqs=settings.max_concurrency,
        kv_cache_gib=settings.kv_cache_gib,
        seed=settings.seed,
        enforce_eager=settings.enforce_eager,
    )
    identity = ModelIdentity(
        name=base_dir.name,
        path=str(checkpoint),
        mode=settings.mode,
        artefact_id=tokenizer.artefact_id,
        base_fingerprint=tokenizer.fingerprint,
    )
    return LoadedModel(identity, engine_config, predictor)
