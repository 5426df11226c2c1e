"""The one subject split of the project: MEDS's `metadata/subject_splits.parquet` when the dataset
has one (splits `train`, `tuning`, `held_out`), otherwise a seeded fraction of the subjects
held out and the rest `train`.

Every caller splits this way: `medtpe build-artefact` (trains on `train`, validates and gates on
the others), `medtpe ssft` (its validation subjects), `medtpe evaluate`, `medtpe predict` and
`medtpe render` (`--split`). The seeded split is over the subjects the caller has (the build's
prediction times, a label file's rows), so a build and an evaluation over the same subjects
agree: the default artefact's 13 held-out patients are `held_out` of the demo dataset's
ICU-mortality label file.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import meds

from medtpe.core.meds.readers import read_subject_splits

TRAIN = meds.train_split
TUNING = meds.tuning_split
HELD_OUT = meds.held_out_split
SPLIT_NAMES = (TRAIN, TUNING, HELD_OUT)

DEFAULT_HELD_OUT = 0.2
"""Fraction of the subjects the seeded split holds out."""
DEFAULT_SEED = 1
"""Seed of the seeded split's shuffle."""

SPLITS_FILE_SOURCE = meds.subject_splits_filepath


@dataclass(frozen=True)
class SubjectSplit:
    """Each subject's split (`TRAIN`, `TUNING` or `HELD_OUT`) and where it came from (`source`:
    `metadata/subject_splits.parquet`, or the seeded split's fraction and seed)."""

    splits: Mapping[int, str]
    source: str

    def split_of(self, subject_id: int) -> str | None:
        """The subject's split (None: a subject the split does not know)."""
        return self.splits.get(subject_id)

    def keeps(self, subject_id: int, split: str | None) -> bool:
        """Whether the subject is in `split` (None: every subject is kept)."""
        return split is None or self.splits.get(subject_id) == split

    def subjects(self, split: str) -> list[int]:
        """The subjects of `split`, ascending."""
        return sorted(s for s, name in self.splits.items() if name == split)

    def train_and_held_out(self, subjects: Iterable[int]) -> tuple[list[int], list[int]]:
        """`subjects` (deduplicated, ascending) as (those in `train`, the others: tuning,
        held out, or unknown to the split)."""
        ordered = sorted(set(subjects))
        train = [s for s in ordered if self.splits.get(s) == TRAIN]
        return train, [s for s in ordered if self.splits.get(s) != TRAIN]


def seeded_split(
    subjects: Iterable[int], held_out: float = DEFAULT_HELD_OUT, seed: int = DEFAULT_SEED
) -> SubjectSplit:
    """The subjects (deduplicated, ascending) shuffled with `seed`, the first `held_out`
    fraction (at least one subject) `HELD_OUT`, the rest `TRAIN`."""
    order = sorted(set(subjects))
    random.Random(seed).shuffle(order)
    n_held = max(1, round(len(order) * held_out))
    splits = {s: HELD_OUT for s in order[:n_held]} | {s: TRAIN for s in order[n_held:]}
    source = f"seeded: held_out {held_out} of {len(order)} subjects, seed {seed}"
    return SubjectSplit(splits, source)


def subject_split(
    meds_dir: str | Path,
    subjects: Iterable[int],
    held_out: float = DEFAULT_HELD_OUT,
    seed: int = DEFAULT_SEED,
) -> SubjectSplit:
    """The dataset's `metadata/subject_splits.parquet` when it has one, otherwise
    `seeded_split(subjects, held_out, seed)`."""
    declared = read_subject_splits(meds_dir)
    if declared:
        return SubjectSplit(declared, SPLITS_FILE_SOURCE)
    return seeded_split(subjects, held_out, seed)
