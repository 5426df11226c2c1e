"""A mode's per-record results written as a meds-evaluation `predictions.parquet` (the format:
`medtpe.core.meds.predictions_file`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from medtpe.core.meds.predictions_file import results_table
from medtpe.core.tasks import Task
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.records import EvalRecord


def predictions_table(
    task: Task, records: Sequence[EvalRecord], results: Sequence[RecordResult]
) -> pa.Table:
    """The predictions of one mode for `records` (matched to `results` by key)."""
    by_key = {r.key: r for r in results}
    missing = [r.key for r in records if r.key not in by_key]
    if missing:
        raise ValueError(f"no result for records {missing[:5]}")
    return results_table(
        task,
        [r.events.subject_id for r in records],
        [r.prediction_time for r in records],
        [by_key[r.key] for r in records],
    )


def write_predictions(
    task: Task, records: Sequence[EvalRecord], results: Sequence[RecordResult], path: Path
) -> None:
    """Write `predictions_table` to `path` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(predictions_table(task, records, results), path)
