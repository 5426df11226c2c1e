"""The labelled records of an evaluation: a MEDS label file's rows with their subjects' events.

Prompts are built per mode by the service's `Predictor` with the input budget counted in
ORIGINAL tokenizer tokens, so both modes get exactly the same prompt text (equal information).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from evaluation.results import record_key
from medtpe_core.meds import SubjectEvents
from medtpe_core.meds_readers import MedsDataset, read_labels, read_subject_splits
from medtpe_core.tasks import Prediction, Task


@dataclass(frozen=True)
class EvalRecord:
    """One labelled record: its subject's events and the time of the prediction."""

    key: str
    label: Prediction
    events: SubjectEvents
    prediction_time: datetime


def load_records(
    meds_dir: Path,
    labels_path: Path,
    task: Task,
    *,
    subjects: Collection[int] | None = None,
    split: str | None = None,
    limit: int | None = None,
) -> list[EvalRecord]:
    """Rows of the label file (file order), restricted to `subjects` and to the subjects of
    `split` in `metadata/subject_splits.parquet` (when the dataset has one), the first `limit`."""
    dataset = MedsDataset.load(meds_dir)
    splits = read_subject_splits(meds_dir) if split is not None else {}
    rows = [
        row
        for row in read_labels(labels_path)
        if (subjects is None or row.subject_id in subjects)
        and (not splits or splits.get(row.subject_id) == split)
    ]
    if limit is not None:
        rows = rows[:limit]
    known = set(dataset.subject_ids)
    records = []
    for row in rows:
        if row.subject_id not in known:
            raise ValueError(f"{labels_path}: subject {row.subject_id} has no events in {meds_dir}")
        records.append(
            EvalRecord(
                key=record_key(row.subject_id, row.prediction_time.isoformat()),
                label=task.parse_label(row.value),
                events=dataset.events(row.subject_id),
                prediction_time=row.prediction_time,
            )
        )
    return records
