"""A MEDS dataset as text for vocabulary mining (`medtpe build-tokenizer --corpus <MEDS dir>`),
read one data shard at a time (MEDS keeps each subject in one shard), never the whole dataset."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from medtpe.core.meds.events import SubjectEvents
from medtpe.core.meds.readers import (
    MedsDataset,
    MedsFormatError,
    data_shards,
    read_prediction_times,
)
from medtpe.core.prompt.render import TokenEncoder, render_record

DEFAULT_CHUNK_EVENTS = 2000
LABELS_SUBDIRECTORY = "labels"  # MEDS label files of a dataset (not in the `meds` package)


@dataclass(frozen=True)
class CorpusSpec:
    """What to render from a MEDS dataset: records at the label times of `meds_dir/labels/` (or
    of `labels` when given), cut to the newest `max_tokens` original tokens; without labels each
    subject's whole history in chunks of about `chunk_events` events. `subjects`: only these."""

    meds_dir: Path
    max_tokens: int | None = None
    chunk_events: int = DEFAULT_CHUNK_EVENTS
    subjects: frozenset[int] | None = None
    labels: Path | None = None

    @property
    def labels_path(self) -> Path | None:
        """The label file or directory records are taken at, None for whole histories."""
        if self.labels is not None:
            return self.labels
        labels_dir = self.meds_dir / LABELS_SUBDIRECTORY
        has_labels = labels_dir.is_dir() and any(labels_dir.glob("**/*.parquet"))
        return labels_dir if has_labels else None

    def label_subjects(self) -> set[int]:
        """Subjects with a label row (empty without labels)."""
        path = self.labels_path
        return {s for s, _ in read_prediction_times(path, self.subjects)} if path else set()


class ShardCorpus:
    """The rendered records of one data shard."""

    def __init__(self, spec: CorpusSpec, shard: Path):
        self.spec = spec
        self.dataset = MedsDataset.load(spec.meds_dir, [shard])
        wanted = set(self.dataset.subject_ids)
        if spec.subjects is not None:
            wanted &= spec.subjects
        self.subject_ids = sorted(wanted)

    def texts(self, encoder: TokenEncoder | None = None) -> Iterator[str]:
        """The shard's records as text (`encoder` counts tokens for `max_tokens`)."""
        spec, dataset = self.spec, self.dataset
        path = spec.labels_path
        if path is not None:
            for subject_id, time in read_prediction_times(path, self.subject_ids):
                events = dataset.events(subject_id)
                yield render_record(
                    events, dataset.descriptions, time, encoder, spec.max_tokens
                ).text
            return
        for subject_id in self.subject_ids:
            for chunk in _chunks(dataset.events(subject_id), spec.chunk_events):
                yield render_record(chunk, dataset.descriptions).text


def check_label_subjects(spec: CorpusSpec, seen: set[int]) -> None:
    """`MedsFormatError` if a label row's subject is in none of the shards (`seen`)."""
    missing = sorted(spec.label_subjects() - seen)
    if missing:
        raise MedsFormatError(
            f"{spec.labels_path}: subject {missing[0]} is not in {spec.meds_dir}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )


def iter_meds_corpus_texts(
    meds_dir: str | Path,
    base_tokenizer: TokenEncoder | None = None,
    max_tokens: int | None = None,
    chunk_events: int = DEFAULT_CHUNK_EVENTS,
) -> Iterator[str]:
    """Rendered records of a MEDS dataset, in the format the prompts use, shard by shard.

    With label files under `meds_dir/labels/`: one record per distinct (subject, prediction time),
    rendered from the events before that time, cut to the newest `max_tokens` original tokens
    when given (needs `base_tokenizer`), as at inference. Without labels: each subject's whole
    history, in chunks of about `chunk_events` events cut at timestamp boundaries.
    """
    spec = CorpusSpec(Path(meds_dir), max_tokens, chunk_events)
    seen: set[int] = set()
    for shard in data_shards(spec.meds_dir):
        corpus = ShardCorpus(spec, shard)
        seen.update(corpus.subject_ids)
        yield from corpus.texts(base_tokenizer)
    check_label_subjects(spec, seen)


def _chunks(events: SubjectEvents, chunk_events: int) -> Iterator[SubjectEvents]:
    """Consecutive pieces of about `chunk_events` events, never splitting a timestamp."""
    times = events.times.astype("int64")
    starts = np.flatnonzero(np.r_[True, times[1:] != times[:-1]]) if len(times) else np.array([0])
    begin = 0
    while begin < len(events):
        after = starts[starts >= begin + chunk_events]
        end = int(after[0]) if after.size else len(events)
        mask = np.zeros(len(events), dtype=bool)
        mask[begin:end] = True
        yield events.take(mask)
        begin = end
