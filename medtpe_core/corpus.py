"""A MEDS dataset as text for vocabulary mining (`medtpe build-tokenizer --corpus <MEDS dir>`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from medtpe_core.meds import SubjectEvents
from medtpe_core.meds_readers import MedsDataset, MedsFormatError, read_labels
from medtpe_core.render import TokenEncoder, render_record

DEFAULT_CHUNK_EVENTS = 2000


def iter_meds_corpus_texts(
    meds_dir: str | Path,
    base_tokenizer: TokenEncoder | None = None,
    max_tokens: int | None = None,
    chunk_events: int = DEFAULT_CHUNK_EVENTS,
) -> Iterator[str]:
    """Rendered records of a MEDS dataset, in the format the prompts use.

    With label files under `meds_dir/labels/`: one record per distinct (subject, prediction time),
    rendered from the events before that time, cut to the newest `max_tokens` original tokens
    when given (needs `base_tokenizer`), as at inference. Without labels: each subject's whole
    history, in chunks of about `chunk_events` events cut at timestamp boundaries.
    """
    meds_dir = Path(meds_dir)
    dataset = MedsDataset.load(meds_dir)
    labels_dir = meds_dir / "labels"
    if labels_dir.is_dir() and any(labels_dir.glob("**/*.parquet")):
        seen = set()
        for row in read_labels(labels_dir):
            key = (row.subject_id, row.prediction_time)
            if key in seen:
                continue
            seen.add(key)
            if row.subject_id not in dataset.subject_ids:
                raise MedsFormatError(
                    f"{labels_dir}: subject {row.subject_id} is not in {meds_dir}"
                )
            events = dataset.events(row.subject_id)
            yield render_record(
                events, dataset.descriptions, row.prediction_time, base_tokenizer, max_tokens
            ).text
        return
    for events in dataset:
        for chunk in _chunks(events, chunk_events):
            yield render_record(chunk, dataset.descriptions).text


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
