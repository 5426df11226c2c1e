"""Evaluation and batch prediction keep one split's subjects (`medtpe.core.meds.subject_split`):
the dataset's `metadata/subject_splits.parquet`, or without one the seeded held-out fraction of
the label file's subjects, the same in `load_records` and `medtpe predict`'s plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from medtpe.batch.job import Job, plan_shards
from medtpe.core.meds.subject_split import HELD_OUT, TRAIN, TUNING, seeded_split
from medtpe.core.tasks import get_task
from medtpe.evaluation.records import load_records
from tests.support.meds_fixtures import write_meds_dataset, write_subject_splits

TASK = get_task("icu_mortality")
SUBJECTS = (1, 2, 3, 4, 5)


def planned_subjects(meds: Path, split: str | None) -> list[int]:
    job = Job(meds, TASK, labels=meds / "labels" / "icu_mortality.parquet", split=split)
    return sorted(r.subject_id for plan in plan_shards(job) for r in plan.requests)


def loaded_subjects(meds: Path, split: str | None) -> list[int]:
    labels = meds / "labels" / "icu_mortality.parquet"
    return sorted(r.events.subject_id for r in load_records(meds, labels, TASK, split=split))


@pytest.mark.parametrize("read", [planned_subjects, loaded_subjects])
def test_with_a_splits_file(read, tmp_path: Path) -> None:
    meds = write_meds_dataset(tmp_path / "meds", subjects=SUBJECTS, hours=6)
    write_subject_splits(meds, {1: TRAIN, 2: TUNING, 3: HELD_OUT, 4: HELD_OUT, 5: TRAIN})
    assert read(meds, HELD_OUT) == [3, 4]
    assert read(meds, TUNING) == [2]
    assert read(meds, None) == list(SUBJECTS)


@pytest.mark.parametrize("read", [planned_subjects, loaded_subjects])
def test_without_a_splits_file(read, tmp_path: Path) -> None:
    meds = write_meds_dataset(tmp_path / "meds", subjects=SUBJECTS, hours=6)
    seeded = seeded_split(SUBJECTS)  # the defaults: 20 % held out, seed 1
    assert read(meds, HELD_OUT) == seeded.subjects(HELD_OUT) and len(seeded.subjects(HELD_OUT)) == 1
    assert read(meds, TRAIN) == seeded.subjects(TRAIN)
    assert read(meds, TUNING) == []
    assert read(meds, None) == list(SUBJECTS)
