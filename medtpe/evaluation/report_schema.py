"""The evaluation report as types: what `medtpe evaluate` writes and `medtpe rescore` rewrites.

`EvaluationReport.to_json()` gives the JSON object the report files hold, keys in this order:
`settings`, `fidelity` (both modes), `original` / `medtpe` (each mode's figures), the paired
differences and agreement (both modes), `records` (per-record results), then what a later step
adds (`meds_evaluation` from `medtpe rescore`; a study's own block, e.g. `without_replacement`).
A key that does not apply (one mode; a multi-label task's AUROC) is left out, as before.
`EvaluationReport.from_json` reads every report in `tools/benchmarks/results/` and
`tools/research/results/`, including those written before the bootstrap intervals (a mode's `f1` and
`auroc` a plain number, `f1_std` beside it) and those that named p(yes) and the prompt's original
tokens otherwise (`p_positive`, `n_tokens_original`, ...: read under their current names,
`medtpe.core.figure_names.RENAMED`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from medtpe.core.figure_names import current_names
from medtpe.core.metrics import Interval
from medtpe.evaluation.record_result import RecordResult


class _Figures(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


class Fidelity(_Figures):
    """MedTPE against the original on the same records (`medtpe.core.metrics.fidelity.fidelity`)."""

    n_records: int
    n_subjects: int
    same_answer: Interval
    n_answered: int | None = None
    """Records at least one model answered (`same_answer`'s records); None in reports written
    before agreement left out the records neither answers."""
    delta_p_mean: Interval
    delta_p_p95: Interval
    delta_p_n: int
    kl_mean: Interval
    same_stop: float
    generated_tokens_mean: dict[str, float]
    generated_tokens_ratio: float | None
    fcr_strict: dict[str, float]
    trailing_text: dict[str, int]
    answer_counts: dict[str, dict[str, int]]
    bootstrap_resamples: int


class ModeSummary(_Figures):
    """One mode's figures (`medtpe.evaluation.figures.summarise_mode`): quality with patient-level
    bootstrap intervals (AUROC, AUPRC, Brier, ECE and `p_yes_n` for binary tasks only),
    format compliance, latency, prompt tokens, and for MedTPE the compression rate."""

    n_records: int
    n_subjects: int | None = None
    f1: Interval | float
    """A float (and `f1_std`) in reports written before the bootstrap intervals."""
    f1_std: float | None = None
    n_positive: int | None = None
    auroc: Interval | float | None = None
    auprc: Interval | None = None
    brier: Interval | None = None
    ece: Interval | None = None
    p_yes_n: int | None = None
    fcr: float
    latency_s_mean: float
    latency_s_total: float
    generate_s_mean: float
    tokens_mean: float
    original_tokens_mean: float
    load_avg_1m_mean: float
    compression_rate: float | None = None


class EvaluationReport(BaseModel):
    """One evaluation: its settings, the figures of each mode, with both modes their fidelity
    and paired comparison, and every record's result by mode."""

    # NaN stays NaN (meds-evaluation's undefined scores), as `json.dumps` writes it
    model_config = ConfigDict(extra="allow", frozen=True, ser_json_inf_nan="constants")

    settings: dict[str, Any]
    fidelity: Fidelity | None = None
    original: ModeSummary | None = None
    medtpe: ModeSummary | None = None
    delta_f1: Interval | None = None
    delta_auroc: Interval | None = None
    delta_auprc: Interval | None = None
    agreement: float | None = None
    agreement_answered: float | None = None
    latency_reduction: float | None = None
    p_yes_correlation: float | None = None
    p_yes_mae: float | None = None
    p_yes_max_abs_diff: float | None = None
    p_yes_pairs: int | None = None
    records: dict[str, list[RecordResult]]
    """Per-record results by mode (rows written before a field existed get its default)."""
    meds_evaluation: dict[str, Any] | None = None
    """meds-evaluation's scores of each mode's predictions file (`medtpe rescore`)."""

    def mode(self, name: str) -> ModeSummary | None:
        """The figures of mode `name` (`original` or `medtpe`; None when not evaluated)."""
        return {"original": self.original, "medtpe": self.medtpe}[name]

    def to_json(self) -> dict[str, Any]:
        """The report file's JSON object (keys that do not apply left out)."""
        data = self.model_dump(mode="json", exclude_unset=True, exclude={"records"})
        records = {mode: [r.to_json() for r in rows] for mode, rows in self.records.items()}
        ordered: dict[str, Any] = {}
        for name in data:  # records in its place: after the declared figures, before extras
            if name == "meds_evaluation" or name in (self.model_extra or {}):
                ordered.setdefault("records", records)
            ordered[name] = data[name]
        ordered.setdefault("records", records)
        return ordered

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EvaluationReport:
        """A report from its JSON object (any report file `to_json` or an earlier version
        wrote: keys renamed since are read under their current names)."""
        report = current_names(data)
        for mode in ("original", "medtpe"):
            if isinstance(report.get(mode), Mapping):
                report[mode] = current_names(report[mode])
        if isinstance(report.get("records"), Mapping):
            report["records"] = {
                mode: [current_names(row) for row in rows]
                for mode, rows in report["records"].items()
            }
        return cls.model_validate(report)

    @classmethod
    def read(cls, path: str | Path) -> EvaluationReport:
        """The report file at `path`."""
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))

    def write(self, path: str | Path) -> None:
        """Write the report to `path` (indented JSON; parents created)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
