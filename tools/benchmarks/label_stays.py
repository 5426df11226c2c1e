"""The labelled stays of a MEDS dataset for the benchmarks: each label row of a task with its
subject's events up to the prediction time (as a hospital would send them), every row or only
those of one split of the project's subject split (`medtpe.core.meds.subject_split`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from medtpe.core.meds import MedsDataset, PredictionPoint, SubjectEvents, read_labels
from medtpe.core.meds.subject_split import subject_split


def label_stays(
    meds: Path, task: str, split: str | None = None
) -> Iterator[tuple[PredictionPoint, SubjectEvents]]:
    """Each row of `meds`'s `labels/{task}.parquet`, in file order, whose subject is in `split`
    (None: every row), with the subject's events up to the row's prediction time."""
    dataset = MedsDataset.load(meds)
    rows = read_labels(meds / "labels" / f"{task}.parquet")
    kept = subject_split(meds, [row.subject_id for row in rows])
    for row in rows:
        if kept.keeps(row.subject_id, split):
            yield row, dataset.events(row.subject_id).before(row.prediction_time)
