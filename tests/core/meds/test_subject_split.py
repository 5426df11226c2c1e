"""The one subject split (`medtpe.core.meds.subject_split`): a dataset's
`metadata/subject_splits.parquet` when it has one, otherwise the seeded held-out fraction that
built the default artefact (pinned here on fixed lists)."""

from __future__ import annotations

from pathlib import Path

from medtpe.core.meds.subject_split import (
    HELD_OUT,
    SPLITS_FILE_SOURCE,
    TRAIN,
    TUNING,
    seeded_split,
    subject_split,
)
from tests.support.meds_fixtures import write_meds_dataset, write_subject_splits

DECLARED = {1: TRAIN, 2: TUNING, 3: HELD_OUT, 4: TRAIN}


def test_seeded_split_is_pinned() -> None:
    """The formula the default artefact was built with (build.yaml: held_out 0.2, seed 1): the
    same subjects must keep giving the same held-out subjects."""
    split = seeded_split(range(1, 64), 0.2, 1)
    assert split.subjects(HELD_OUT) == [3, 6, 10, 20, 23, 26, 27, 30, 33, 36, 45, 58, 63]
    assert split.subjects(TRAIN) == sorted(set(range(1, 64)) - set(split.subjects(HELD_OUT)))
    # duplicates and order do not matter; at least one subject is held out
    small = seeded_split([5, 3, 3, 9, 1, 7, 2], 0.3, 7)
    assert (small.subjects(TRAIN), small.subjects(HELD_OUT)) == ([2, 3, 5, 9], [1, 7])
    assert small.train_and_held_out([9, 1, 1]) == ([9], [1])
    assert seeded_split([4], 0.01, 0).subjects(HELD_OUT) == [4]
    assert "seed 1" in split.source and "63 subjects" in split.source


def test_the_datasets_splits_file_wins(tmp_path: Path) -> None:
    root = write_subject_splits(
        write_meds_dataset(tmp_path / "meds", subjects=(1, 2, 3, 4)), DECLARED
    )
    split = subject_split(root, [1, 2, 3, 4], held_out=0.5, seed=3)
    assert split.source == SPLITS_FILE_SOURCE == "metadata/subject_splits.parquet"
    assert dict(split.splits) == DECLARED
    assert split.subjects(TRAIN) == [1, 4] and split.subjects(TUNING) == [2]
    assert split.keeps(3, HELD_OUT) and not split.keeps(3, TRAIN) and split.keeps(3, None)
    # the build: train on `train`, validate and gate on the others (and on unknown subjects)
    assert split.train_and_held_out([1, 2, 3, 4, 5]) == ([1, 4], [2, 3, 5])


def test_without_a_splits_file_the_seeded_split(tmp_path: Path) -> None:
    root = write_meds_dataset(tmp_path / "meds", subjects=(1, 2, 3, 4, 5))
    split = subject_split(root, [1, 2, 3, 4, 5], held_out=0.4, seed=2)
    assert split == seeded_split([1, 2, 3, 4, 5], 0.4, 2)
    assert len(split.subjects(HELD_OUT)) == 2 and not split.subjects(TUNING)
    assert split.source.startswith("seeded")
