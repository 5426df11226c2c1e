"""A mode's per-record results as a meds-evaluation `predictions.parquet`.

Columns (meds-evaluation's `PredictionSchema`, a MEDS label file plus two): `subject_id`,
`prediction_time`, `boolean_value` (the label), `predicted_boolean_value` and
`predicted_boolean_probability`.

- Binary tasks: one row per record; the probability is `p_positive` (p(yes) from the first
  answer token, `UNSCORED_PROBABILITY` where the model gave none); an unparsed answer is written
  as the wrong value (the report's F1 convention, as in the paper).
- Multi-label tasks (meds-evaluation scores binary tasks only): one row per record and label,
  a record's rows in the task's label order (meds-evaluation's schema allows no extra column to
  name the label); no probability (null). meds-evaluation then pools all labels
  (micro-averaged), where the report's F1 is macro-averaged over labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import meds
import pyarrow as pa
import pyarrow.parquet as pq

from evaluation.figures import labels_matrix, positive_scores, scored_predictions
from evaluation.record_result import RecordResult, ScoredRecord
from evaluation.records import EvalRecord
from medtpe_core.tasks import Task

PREDICTED_VALUE = "predicted_boolean_value"
PREDICTED_PROBABILITY = "predicted_boolean_probability"


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


def results_table(
    task: Task,
    subjects: Sequence[int],
    times: Sequence[datetime],
    ordered: Sequence[ScoredRecord],
) -> pa.Table:
    """The predictions of `ordered` results (their label, prediction, format and p_positive),
    the i-th for `subjects[i]` at `times[i]`."""
    labels = labels_matrix(task, ordered)
    predicted = scored_predictions(task, ordered)
    subjects, times = list(subjects), list(times)
    if task.label_type == "binary":
        return _table(subjects, times, labels, predicted, positive_scores(ordered).tolist())
    n_labels = len(task.labels)
    return _table(
        [s for s in subjects for _ in range(n_labels)],
        [t for t in times for _ in range(n_labels)],
        labels.reshape(-1),
        predicted.reshape(-1),
        [None] * (len(ordered) * n_labels),
    )


def write_predictions(
    task: Task, records: Sequence[EvalRecord], results: Sequence[RecordResult], path: Path
) -> None:
    """Write `predictions_table` to `path` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(predictions_table(task, records, results), path)


def _table(
    subjects: list[int],
    times: list[datetime],
    labels: object,
    predicted: object,
    probabilities: list[float | None],
) -> pa.Table:
    return pa.table(
        {
            meds.LabelSchema.subject_id_name: pa.array(subjects, pa.int64()),
            meds.LabelSchema.prediction_time_name: pa.array(times, pa.timestamp("us")),
            meds.LabelSchema.boolean_value_name: pa.array(labels, pa.bool_()),
            PREDICTED_VALUE: pa.array(predicted, pa.bool_()),
            # float64: MEDS-DEV's pinned meds-evaluation (0.0.3) requires it; 0.0.6 casts it
            PREDICTED_PROBABILITY: pa.array(probabilities, pa.float64()),
        }
    )
