"""Per-record results as a meds-evaluation predictions file (`predictions.parquet`).

Columns (meds-evaluation's `PredictionSchema`, a MEDS label file plus two): `subject_id`,
`prediction_time`, `boolean_value` (the label), `predicted_boolean_value` and
`predicted_boolean_probability`.

- Binary tasks: one row per record; the probability is the record's `p_yes` (p(yes) from the
  first answer token, `UNSCORED_PROBABILITY` where the model gave none); an unparsed answer is
  written as the wrong value (the report's F1 convention, as in the paper).
- Multi-label tasks (meds-evaluation scores binary tasks only): one row per record and label,
  a record's rows in the task's label order (meds-evaluation's schema allows no extra column to
  name the label); no probability (null). meds-evaluation then pools all labels
  (micro-averaged), where the report's F1 is macro-averaged over labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

import meds
import numpy as np
import pyarrow as pa

from medtpe.core.metrics.scores import wrong_prediction
from medtpe.core.tasks import Prediction, Task

PREDICTED_VALUE = "predicted_boolean_value"
PREDICTED_PROBABILITY = "predicted_boolean_probability"
UNSCORED_PROBABILITY = 0.5
"""p_yes of a record the model gave no option probability for (no information)."""


class ScoredRecord(Protocol):
    """What a predictions file and the quality figures read of one record's result: an
    evaluation's result, or a batch job's row."""

    @property
    def label(self) -> Any: ...
    @property
    def prediction(self) -> Any: ...
    @property
    def format_ok(self) -> bool: ...
    @property
    def p_yes(self) -> float | None: ...


def as_target(task: Task, value: Prediction | None) -> bool | list[bool]:
    """A label or prediction as F1 input: a bool (binary) or one bool per label (no answer:
    the negative class / no label)."""
    if task.label_type == "binary":
        return bool(value)
    chosen = {value} if isinstance(value, str) else set(value or ())
    return [label in chosen for label in task.labels]


def labels_matrix(task: Task, results: Sequence[ScoredRecord]) -> np.ndarray:
    """The records' labels as F1 input (rows, or rows x labels)."""
    return np.array([as_target(task, r.label) for r in results], dtype=bool)


def scored_predictions(task: Task, results: Sequence[ScoredRecord]) -> np.ndarray:
    """The records' predictions as F1 input, an unparsed answer wrong on every label."""
    return np.array(
        [
            as_target(task, r.prediction)
            if r.format_ok
            else wrong_prediction(as_target(task, r.label))
            for r in results
        ],
        dtype=bool,
    )


def positive_scores(results: Sequence[ScoredRecord]) -> np.ndarray:
    """`p_yes` per record, `UNSCORED_PROBABILITY` where there is none."""
    return np.array([UNSCORED_PROBABILITY if r.p_yes is None else r.p_yes for r in results])


def results_table(
    task: Task,
    subjects: Sequence[int],
    times: Sequence[datetime],
    ordered: Sequence[ScoredRecord],
) -> pa.Table:
    """The predictions of `ordered` results (their label, prediction, format and p_yes),
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
