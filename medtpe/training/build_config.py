"""Settings of `medtpe build-artefact`: a dataclass, loadable from a YAML file (`--config`) whose
keys are its field names; command-line options override the file. Relative paths are taken
from the current directory."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import yaml

from medtpe.core.meds.subject_split import DEFAULT_HELD_OUT
from medtpe.core.metrics.fidelity import Thresholds
from medtpe.core.tokenizer.build import DEFAULT_METHOD, METHODS
from medtpe.inference.engines.protocol import Dtype
from medtpe.inference.model import ModelConfig
from medtpe.training.distill_config import DistillConfig
from medtpe.training.loss_names import LOSSES

DEVICES = ("cpu", "cuda")
SERVING_BUDGET: int = ModelConfig.declared("max_input_tokens").default
"""The service's default input budget: the one a build validates its artefact at by default."""
# Settings that change how a build runs, not what it produces: a resumed build may change them.
RUNTIME_FIELDS = (
    "out",
    "work",
    "device",
    "workers",
    "ray_address",
    "keep_work",
    "min_same_answer",
    "max_delta_p_mean",
)
"""Also the gate's thresholds: a resumed build re-checks its measured fidelity against them."""


class BuildConfigError(ValueError):
    """A build setting is missing, unknown or out of range (the message names it)."""


@dataclass(frozen=True)
class Windows:
    """Prediction times at fixed `hours` after the `start` of each row of a `table` of intervals
    (parquet with `subject_id`, `start` and `end` columns, e.g. ICU stays), before its `end`."""

    table: Path
    start: str
    end: str
    hours: tuple[float, ...]


@dataclass(frozen=True)
class BuildConfig:
    """Everything `medtpe build-artefact` needs (defaults: the default artefact's recipe)."""

    base: Path
    meds: Path
    out: Path
    labels: Path | None = None  # MEDS label file/dir (default: <meds>/labels) ...
    windows: Windows | None = None  # ... or prediction times inside intervals
    tasks: tuple[str, ...] = ("icu_mortality",)  # prediction times alternate between them
    budget: int = 2000
    max_n: int = 2
    method: str = DEFAULT_METHOD
    mining_max_tokens: int = 8192
    plain_tail: int = 0
    """The ids at the end of every prompt left unmerged (the artefact's tokenizer setting,
    `MedTPETokenizer.plain_tail`): the answer read in the base model's own tokens."""
    max_input_tokens: int = 768
    length_mix: tuple[int, ...] = ()
    """Input budgets of the SSFT windows, cycled over them (() = `max_input_tokens` alone); the
    largest must reach the largest serving budget."""
    serving_budgets: tuple[int, ...] = (SERVING_BUDGET,)
    """The input budgets the artefact is validated at: the fidelity gate answers its held-out
    windows at each, and the manifest records those it passed."""
    n_gate: int = 32
    """Held-out windows the fidelity gate answers at each serving budget, in both modes."""
    gate_dtype: str = "float32"
    """The dtype both models answer the gate's windows in (vLLM `dtype`): float32, the rows' own
    error on any machine; `auto`, the machine's served dtype (bfloat16 on a GPU or a bfloat16
    CPU, whose own floor adds ~0.01 to |Δp|: docs/benchmarks.md, Fidelity)."""
    min_same_answer: float = Thresholds.min_same_answer
    max_delta_p_mean: float = Thresholds.max_delta_p_mean
    batch_size: int = 2
    grad_accum: int = 2
    init_from: Path | None = None
    """An earlier stage of a curriculum: a trained artefact whose merges are taken instead of
    mining and whose rows SSFT starts from (None: mine, start from the constituents' mean)."""
    held_out: float = DEFAULT_HELD_OUT
    n_train: int = 368
    n_val: int = 40
    distill: DistillConfig | None = None
    """Token-level distillation of the rows (`medtpe.training.token_distillation`) on snippets of
    the rendered windows, from the constituents' mean or `init_from`'s rows (its `start`); SSFT
    (`losses`), if any, continues from its rows. None: no distillation."""
    losses: tuple[str, ...] = ("ce",)
    lr: float = 5e-4
    epochs: int = 1
    max_steps: int | None = 90
    eval_every: int = 15
    patience: int = 3
    max_new_tokens: int = 16
    seed: int = 1
    measure_agreement: bool = True
    device: str | None = None
    workers: int = 1
    ray_address: str | None = None  # mine on Ray ("local": a new local cluster; "auto"; ray://)
    work: Path | None = None  # default <out>/.build
    keep_work: bool = False

    def __post_init__(self) -> None:
        _check(self.method in METHODS, "method", f"one of {METHODS}")
        _check(set(self.losses) <= set(LOSSES), "losses", f"of {LOSSES}")
        _check(
            bool(self.losses) or self.distill is not None,
            "losses",
            "at least one SSFT loss, unless the rows are distilled (distill)",
        )
        _check(self.device in (None, *DEVICES), "device", f"one of {DEVICES}")
        _check(bool(self.tasks), "tasks", "at least one task")
        _check(0 < self.held_out < 1, "held_out", "a fraction between 0 and 1")
        _check(self.plain_tail >= 0, "plain_tail", "0 or more")
        _check(self.gate_dtype in get_args(Dtype), "gate_dtype", f"one of {get_args(Dtype)}")
        for name in (
            "budget",
            "max_n",
            "n_train",
            "n_val",
            "n_gate",
            "epochs",
            "eval_every",
            "workers",
            "batch_size",
            "grad_accum",
        ):
            _check(getattr(self, name) >= 1, name, "at least 1")
        _check(self.max_steps is None or self.max_steps >= 1, "max_steps", "at least 1")
        _check(self.labels is None or self.windows is None, "labels", "not given with windows")
        _check(bool(self.serving_budgets), "serving_budgets", "at least one budget")
        _check(
            max(self.window_budgets) >= max(self.serving_budgets or (0,)),
            "length_mix",
            f"SSFT windows that reach the largest serving budget ({max(self.serving_budgets)})",
        )
        _check(
            not self.losses or self.distill is None or self.distill.rope_stretch is None,
            "losses",
            "none after a distillation at a RoPE stretch (SSFT reads plain RoPE)",
        )
        _check(0 <= self.min_same_answer <= 1, "min_same_answer", "a fraction between 0 and 1")
        _check(self.max_delta_p_mean >= 0, "max_delta_p_mean", "at least 0")
        _check(
            self.init_from is None or (Path(self.init_from) / "embeddings.safetensors").is_file(),
            "init_from",
            "a trained artefact directory (with embeddings.safetensors)",
        )
        _check(
            self.ray_address is None or (isinstance(self.ray_address, str) and self.ray_address),
            "ray_address",
            "a Ray address ('local', 'auto', ray://HOST:PORT)",
        )
        _check(self.ray_address is None or self.workers == 1, "workers", "1 with ray_address")

    @property
    def window_budgets(self) -> tuple[int, ...]:
        """The SSFT windows' input budgets, cycled over the sampled windows."""
        return self.length_mix or (self.max_input_tokens,)

    @property
    def work_dir(self) -> Path:
        """Where intermediate files and the build state live."""
        return self.work if self.work is not None else self.out / ".build"

    def identity(self) -> dict[str, Any]:
        """The settings that determine the result (a resumed build must have the same)."""
        values = to_dict(self)
        return {k: v for k, v in values.items() if k not in RUNTIME_FIELDS}


def _check(ok: bool, name: str, expected: str) -> None:
    if not ok:
        raise BuildConfigError(f"build setting '{name}': expected {expected}")


def to_dict(config: BuildConfig) -> dict[str, Any]:
    """JSON-ready settings (paths as strings)."""
    return _jsonable(dataclasses.asdict(config))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value) if isinstance(value, Path) else value


_PATHS = ("base", "meds", "out", "labels", "work", "init_from")
_TUPLES = ("tasks", "losses", "length_mix", "serving_budgets")


def build_config(file: Path | None, overrides: dict[str, Any]) -> BuildConfig:
    """Settings from the YAML `file` (if any) with the non-None `overrides` on top."""
    values: dict[str, Any] = {}
    if file is not None:
        loaded = yaml.safe_load(Path(file).read_text()) or {}
        if not isinstance(loaded, dict):
            raise BuildConfigError(f"{file}: expected a mapping of build settings")
        values = {str(k).replace("-", "_"): v for k, v in loaded.items()}
    values |= {k: v for k, v in overrides.items() if v is not None and v != ()}
    names = {f.name for f in dataclasses.fields(BuildConfig)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise BuildConfigError(f"unknown build setting(s): {', '.join(unknown)}")
    for name in ("base", "meds", "out"):
        if values.get(name) is None:
            raise BuildConfigError(f"build setting '{name}' is required (--{name} or the config)")
    for name in _PATHS:
        if values.get(name) is not None:
            values[name] = Path(values[name])
    for name in _TUPLES:
        if name in values:
            given = values[name]
            values[name] = (given,) if isinstance(given, str) else tuple(given)
    if values.get("windows") is not None:
        values["windows"] = _windows(values["windows"])
    if values.get("distill") is not None:
        values["distill"] = _distill(values["distill"])
    return BuildConfig(**values)


def _distill(given: Any) -> DistillConfig:
    if isinstance(given, DistillConfig):
        return given
    names = {f.name for f in dataclasses.fields(DistillConfig)}
    if not isinstance(given, dict) or not set(given) <= names:
        raise BuildConfigError(f"build setting 'distill': expected keys of {sorted(names)}")
    try:
        return DistillConfig(**given)
    except (TypeError, ValueError) as exc:
        raise BuildConfigError(f"build setting 'distill': {exc}") from exc


def _windows(given: Any) -> Windows:
    if isinstance(given, Windows):
        return given
    if not isinstance(given, dict) or set(given) != {"table", "start", "end", "hours"}:
        raise BuildConfigError("build setting 'windows': expected table, start, end, hours")
    hours = tuple(float(h) for h in given["hours"])
    return Windows(Path(given["table"]), str(given["start"]), str(given["end"]), hours)
