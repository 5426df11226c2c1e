"""The labelled records of an evaluation: a MEDS label file's rows with their subjects' events.

Prompts are built per mode by the service's `Predictor` with the input budget counted in
ORIGINAL tokenizer tokens, so both modes get exactly the same prompt text (equal information).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from medtpe.core.meds import MedsDataset, SubjectEvents, read_labels
from medtpe.core.meds.prediction_point import LabelValue, PredictionPoint
from medtpe.core.meds.subject_split import subject_split
from medtpe.core.tasks import Task


@dataclass(frozen=True)
class EvalRecord:
    """A labelled prediction point (its label as the task reads it) with its subject's events."""

    point: PredictionPoint
    events: SubjectEvents

    @property
    def key(self) -> str:
        """The point's key (`subject@prediction time`), shared by both modes' results."""
        return self.point.key

    @property
    def label(self) -> LabelValue:
        """The point's parsed label (None: unlabelled)."""
        return self.point.label

    @property
    def prediction_time(self) -> datetime:
        """The time of the prediction."""
        return self.point.prediction_time


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
    `split` (`medtpe.core.meds.subject_split` over the label file's subjects; None: every subject),
    the first `limit`."""
    dataset = MedsDataset.load(meds_dir)
    points = read_labels(labels_path)
    by_split = subject_split(meds_dir, (point.subject_id for point in points))
    points = [
        point
        for point in points
        if (subjects is None or point.subject_id in subjects)
        and by_split.keeps(point.subject_id, split)
    ]
    if limit is not None:
        points = points[:limit]
    known = set(dataset.subject_ids)
    records = []
    for point in points:
        if point.subject_id not in known:
            raise ValueError(
                f"{labels_path}: subject {point.subject_id} has no events in {meds_dir}"
            )
        records.append(EvalRecord(point.parsed(task), dataset.events(point.subject_id)))
    return records
