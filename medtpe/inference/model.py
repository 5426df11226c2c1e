"""What a caller of the engine loads: the base checkpoint, the MedTPE artefact, and in `medtpe`
mode the exported checkpoint. `load_model(ModelConfig(...))` is the one entry point of the
service, the evaluation and the benchmarks; it only reads: the checkpoints are written offline
(`medtpe prepare-model`, `medtpe export`; `medtpe.training.export.prepare_model_files` for the
offline tools), and a missing or stale one is a `ModelFilesMissing` naming the command to run.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from medtpe.core.declared import Declared, declared, described
from medtpe.core.meds.readers import read_code_descriptions
from medtpe.core.paths import default_artefact_dir, default_export_dir, default_model_dir
from medtpe.core.prompt import ChatTemplate, PromptLayout, Windowing, WindowPolicy
from medtpe.core.prompt.layout import DEFAULT_LAYOUT
from medtpe.core.prompt.task_prompt import DEFAULT_MAX_INPUT_TOKENS
from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.core.tokenizer.artefact_manifest import (
    ArtefactBundle,
    RenderingCheck,
    check_rendering,
    unvalidated_budget_message,
)
from medtpe.inference.checkpoints import check_base_model, check_export
from medtpe.inference.engines.protocol import EngineConfig, EngineOptions
from medtpe.inference.predictor import Mode, Predictor

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelConfig:
    """Which model, artefact and mode to load, the prompt budget and the engine's options: the one
    declaration of each one's default and help (`medtpe.core.declared`)."""

    model_dir: Path = field(
        default_factory=default_model_dir,
        metadata=described(
            "Base Hugging Face checkpoint (the default one: `medtpe prepare-model`)."
        ),
    )
    artefact_dir: Path = field(
        default_factory=default_artefact_dir, metadata=described("MedTPE artefact directory.")
    )
    export_dir: Path = field(
        default_factory=default_export_dir,
        metadata=described(
            "Exported checkpoint (base + MedTPE rows) that vLLM loads in `medtpe` mode; written "
            "offline by `medtpe export` (missing or from another artefact: a start-up error)."
        ),
    )
    mode: Mode = field(
        default="medtpe",
        metadata=described("`medtpe` or `original` (base tokenizer and model)."),
    )
    codes_dir: Path | None = field(
        default=None,
        metadata=described(
            "MEDS dataset root whose `metadata/codes.parquet` describes, in rendered records, "
            "the codes the artefact's own table (the text the model was built on) does not: "
            "the artefact's descriptions first, then this table's, then a FHIR coding's "
            "display; with `codes_replace`, this table replaces the artefact's instead. A "
            "rendering that differs from the artefact's is reported at start (a warning, "
            "`/readyz` `rendering`); a code no table describes is shown by its name "
            "(`Lab 220045`)."
        ),
    )
    codes_replace: bool = field(
        default=False,
        metadata=described(
            "With `codes_dir`: its table replaces the artefact's code descriptions instead of "
            "describing only the codes the artefact does not (`/readyz` `rendering` and a "
            "batch job's summary name it: `override`)."
        ),
    )
    max_input_tokens: int = field(
        default=DEFAULT_MAX_INPUT_TOKENS,  # 8,192: the default artefact's gate passed at it
        metadata=described(
            "Input budget in ORIGINAL-tokenizer tokens, prompt included; the newest events that "
            "fit are kept (the same text in both modes); shrunk to the model's context minus the "
            "answer tokens."
        ),
    )
    max_new_tokens: int = field(
        default=64, metadata=described("Tokens generated per answer at most.")
    )
    prompt_layout: PromptLayout = field(
        default=DEFAULT_LAYOUT,
        metadata=described(
            "Where the record sits in the prompt: `record-first.v1` (a head that names no task, "
            "the record, then the task: the tasks asked of one record share its prefill) or "
            "`task-first.v1` (the task's instruction, the record, the question: the layout of "
            "receipts that name none)."
        ),
    )
    windowing: Windowing = field(default_factory=Windowing)
    """Which events of a record over the budget the prompt shows
    (`medtpe.core.prompt.windowing`)."""
    engine: EngineOptions = field(default_factory=EngineOptions)

    @classmethod
    def option_names(cls) -> frozenset[str]:
        """The flat option names `from_options` takes."""
        own = {f.name for f in fields(cls)} - {"windowing", "engine"}
        return frozenset(own | {f.name for f in fields(EngineOptions)} | set(WINDOWING_OPTIONS))

    @classmethod
    def declared(cls, name: str) -> Declared:
        """The declaration (default, help) of flat option `name` (see `from_options`)."""
        if name in WINDOWING_OPTIONS:
            return declared(Windowing, WINDOWING_OPTIONS[name])
        if name in {f.name for f in fields(EngineOptions)}:
            return declared(EngineOptions, name)
        return declared(cls, name)

    @classmethod
    def from_options(cls, **values: Any) -> ModelConfig:
        """A config from flat option values (the service's settings, a command's options), each
        named as its field here or in `EngineOptions`, or `window_policy` / `window_grid_hours`
        (`Windowing`); an option not given keeps its declared default."""
        own = {f.name for f in fields(cls)} - {"windowing", "engine"}
        engine = {f.name for f in fields(EngineOptions)}
        unknown = set(values) - cls.option_names()
        if unknown:
            raise TypeError(f"no model or engine option named {', '.join(sorted(unknown))}")
        windowing = {WINDOWING_OPTIONS[k]: v for k, v in values.items() if k in WINDOWING_OPTIONS}
        if "policy" in windowing:
            windowing["policy"] = WindowPolicy(windowing["policy"])
        if "prompt_layout" in values:
            values = values | {"prompt_layout": PromptLayout(values["prompt_layout"])}
        return cls(
            **{k: v for k, v in values.items() if k in own},
            windowing=Windowing(**windowing),
            engine=EngineOptions(**{k: v for k, v in values.items() if k in engine}),
        )


WINDOWING_OPTIONS = {"window_policy": "policy", "window_grid_hours": "grid_hours"}
"""The flat option names of `Windowing`'s fields (`MEDTPE_WINDOW_POLICY`, `--window-policy`)."""


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
    rendering: RenderingCheck
    """How records are rendered, against the artefact's build (code descriptions, version)."""

    def unvalidated_budget(self) -> str | None:
        """Why this model's input budget is untested for MedTPE (None: validated, or the
        `original` mode, which does not use the artefact's rows)."""
        if self.identity.mode != "medtpe":
            return None
        return unvalidated_budget_message(self.bundle, self.predictor.max_input_tokens)


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


def site_descriptions(
    bundle: ArtefactBundle, codes_dir: Path | None, replace: bool = False
) -> dict[str, str]:
    """The code descriptions records are rendered with: the artefact's (what the model was built
    on), then `codes_dir`'s table for the codes the artefact does not describe; with `replace`,
    `codes_dir`'s table alone (a `ValueError` without one)."""
    if replace and codes_dir is None:
        raise ValueError(
            "codes_replace replaces the artefact's descriptions by codes_dir's: set it"
        )
    site = read_code_descriptions(codes_dir) if codes_dir is not None else {}
    return dict(site) if replace else {**site, **bundle.descriptions}


def load_model(config: ModelConfig) -> LoadedModel:
    """Load the model files of `config` (blocking); `ModelFilesMissing` naming the command to
    run when a checkpoint is missing or the export is stale."""
    base_dir = check_base_model(config.model_dir)
    bundle = ArtefactBundle.from_pretrained(config.artefact_dir)
    tokenizer = MedTPETokenizer.load(config.artefact_dir, base=base_dir)
    if config.mode == "medtpe":
        checkpoint = check_export(base_dir, config.artefact_dir, config.export_dir)
    else:
        checkpoint = base_dir
    budget = input_budget(config, checkpoint)
    descriptions = site_descriptions(bundle, config.codes_dir, config.codes_replace)
    overridden = config.codes_replace
    rendering = check_rendering(bundle, descriptions, overridden, config.prompt_layout)
    if rendering.matches_artefact is False:
        where = f" (codes_dir {config.codes_dir})" if config.codes_dir is not None else ""
        logger.warning(
            "records are rendered otherwise than the MedTPE artefact %s was built with%s: %s; "
            "its merges and rows were trained and validated on other text",
            bundle.artefact_id,
            where,
            "; ".join(rendering.differences),
        )
    predictor = Predictor(
        tokenizer,
        ChatTemplate.from_model_dir(base_dir),
        config.mode,
        budget,
        descriptions,
        windowing=config.windowing,
        layout=config.prompt_layout,
    )
    engine_config = EngineConfig(checkpoint, budget + config.max_new_tokens, config.engine)
    identity = ModelIdentity(
        name=base_dir.name,
        mode=config.mode,
        artefact_id=tokenizer.artefact_id,
        base_fingerprint=tokenizer.fingerprint,
    )
    predictor.stop_ids  # noqa: B018 - the stop rule's ids, computed once here, not in a request
    return LoadedModel(identity, engine_config, predictor, bundle, rendering)
