"""MEDS label files for the built-in tasks, derived from any MEDS dataset's events.

`derive_labels(dataset, task)` gives one `PredictionPoint` per prediction (subject, prediction
time, label) and `write_labels` writes them as a MEDS label file (`meds.LabelSchema`: binary
tasks in `boolean_value`, phenotyping in `categorical_value`, the phenotype names separated by `|`).

What a label file means: each row asks for a prediction from the subject's data up to and
including `prediction_time` (MEDS's convention, the renderer's default), and no label is ever
recorded at or before its prediction time. Task definitions: `icu.py`, `readmission.py`,
`pancreatic_cancer.py`; the codes they read: `stays.py`; labels from an ACES task
configuration: `aces_labels.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import meds
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from medtpe.core.meds.events import SubjectEvents
from medtpe.core.meds.labels.icu import icu_mortality, phenotyping
from medtpe.core.meds.labels.pancreatic_cancer import pancreatic_cancer_1y
from medtpe.core.meds.labels.readmission import readmission_30d
from medtpe.core.meds.prediction_point import PredictionPoint
from medtpe.core.meds.readers import MedsDataset
from medtpe.core.tasks import Task

__all__ = [
    "LABEL_FUNCTIONS",
    "LabelFunction",
    "aces_labels",
    "derive_labels",
    "icu",
    "label_table",
    "pancreatic_cancer",
    "readmission",
    "stays",
    "write_labels",
]

LabelFunction = Callable[[SubjectEvents, Task], list[PredictionPoint]]

LABEL_FUNCTIONS: dict[str, LabelFunction] = {
    "icu_mortality": lambda events, _task: icu_mortality(events),
    "phenotyping": lambda events, task: phenotyping(events, task.labels),
    "readmission_30d": lambda events, _task: readmission_30d(events),
    "pancreatic_cancer_1y": lambda events, _task: pancreatic_cancer_1y(events),
}
"""The tasks whose labels can be derived from events, by task name."""


def derive_labels(dataset: MedsDataset, task: Task) -> list[PredictionPoint]:
    """The task's label rows over every subject of the dataset (subject order, then time)."""
    if task.name not in LABEL_FUNCTIONS:
        raise KeyError(
            f"no label definition for task {task.name!r}; known: {', '.join(LABEL_FUNCTIONS)}"
        )
    derive = LABEL_FUNCTIONS[task.name]
    rows: list[PredictionPoint] = []
    for events in tqdm(dataset, total=len(dataset.subject_ids), desc=task.name, unit="subject"):
        rows.extend(derive(events, task))
    return rows


def label_table(rows: Iterable[PredictionPoint], task: Task) -> pa.Table:
    """Label rows as a table of `meds.LabelSchema` (value column by the task's label type)."""
    rows = list(rows)
    value_column = (
        meds.LabelSchema.boolean_value_name
        if task.label_type == "binary"
        else meds.LabelSchema.categorical_value_name
    )
    table = pa.table(
        {
            meds.LabelSchema.subject_id_name: pa.array([r.subject_id for r in rows], pa.int64()),
            meds.LabelSchema.prediction_time_name: pa.array(
                [r.prediction_time for r in rows], pa.timestamp("us")
            ),
            value_column: [r.label for r in rows],
        }
    )
    return meds.LabelSchema.align(table)


def write_labels(rows: Iterable[PredictionPoint], task: Task, path: str | Path) -> pa.Table:
    """Write the rows as a MEDS label file at `path` (parents created); returns the table."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = label_table(rows, task)
    pq.write_table(table, path)
    return table
