"""Stored `medtpe evaluate` reports read back: each mode's per-record results, two runs
compared record by record, and a report re-scored with the current metrics (no engine runs:
the answers and p(yes) are the ones the report recorded)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from medtpe.core.tasks import get_task
from medtpe.evaluation.external_scores import meds_evaluation_scores
from medtpe.evaluation.figures import build_report, mode_agreement, positive_shift
from medtpe.evaluation.predictions import write_predictions
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.records import load_records
from medtpe.evaluation.report_schema import EvaluationReport


def stored_results(report: Mapping[str, Any]) -> dict[str, list[RecordResult]]:
    """A report's (JSON object's) per-record results by mode (`EvaluationReport.records`: rows
    written before a field existed load with that field's default)."""
    return EvaluationReport.from_json(report).records


def mode_results(spec: str) -> list[RecordResult]:
    """`REPORT.json:MODE` → that mode's per-record results."""
    path, _, mode = spec.rpartition(":")
    results = EvaluationReport.read(path).records
    if mode not in results:
        raise ValueError(f"{spec}: the report holds the modes {sorted(results)}, not {mode!r}")
    return results[mode]


def compare_runs(first: list[RecordResult], second: list[RecordResult]) -> dict[str, Any]:
    """Share of the records on which two runs give the same answer (matched by key), and how
    far apart their probabilities of the positive answer are."""
    return mode_agreement(first, second) | positive_shift(first, second)


def rescore_report(report_path: Path, predictions_dir: Path) -> EvaluationReport:
    """The report at `report_path` rebuilt from its records with the current metrics, each mode's
    meds-evaluation predictions file written into `predictions_dir` (`<mode>.parquet`) and
    meds-evaluation's own scores of it under `meds_evaluation`."""
    old = EvaluationReport.read(report_path)
    settings = old.settings
    task = get_task(settings["task"])
    results = old.records
    report = build_report(task, results, settings=settings | {"rescored_from": str(report_path)})
    keys = {r.key for r in next(iter(results.values()))}
    records = load_records(Path(settings["meds"]), Path(settings["labels"]), task)
    records = [r for r in records if r.key in keys]
    scores = {}
    for mode, rows in results.items():
        path = predictions_dir / f"{mode}.parquet"
        write_predictions(task, records, rows, path)
        scores[mode] = meds_evaluation_scores(path)
    return report.model_copy(update={"meds_evaluation": scores})
