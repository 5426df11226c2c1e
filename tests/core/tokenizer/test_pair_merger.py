"""`PairMerger` (row-displacement lookups, passes after the first restricted to the pairs next to
the previous pass's merges) against a straightforward reference: left-to-right scans over the
ids, each merging every pair in the table whose left id the scan has not consumed yet, until a
scan merges nothing. Random merge tables with deep chains and random id sequences, the merges
of real builds, and real ICU records."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow.parquet as pq
import pytest

from medtpe.core.meds import MedsDataset, read_labels
from medtpe.core.meds.readers import read_code_descriptions
from medtpe.core.prompt import render_record
from medtpe.core.tokenizer.encoding import PairMerger
from tests.support.render_pins import SHARED_MEDS, base_tokenizer
from tests.support.tokenizer_support import icu_records, smollm2_medtpe

Merges = list[tuple[int, int, int]]


def reference_merge(ids: Sequence[int], merges: Merges) -> list[int]:
    """Repeated greedy left-to-right scans until one merges nothing."""
    table = {(a, b): new for a, b, new in merges}
    ids = list(ids)
    while True:
        out: list[int] = []
        i = 0
        while i < len(ids):
            new = table.get((ids[i], ids[i + 1])) if i + 1 < len(ids) else None
            out.append(ids[i] if new is None else new)
            i += 1 if new is None else 2
        if len(out) == len(ids):
            return out
        ids = out


def random_merges(rng: np.random.Generator, base: int, n: int) -> Merges:
    """`n` merges over `base` base ids, each of two earlier ids (base or merged): chains deep
    enough for many passes, and many left ids with several right ids."""
    merges: Merges = []
    seen: set[tuple[int, int]] = set()
    while len(merges) < n:
        a, b = (int(x) for x in rng.integers(0, base + len(merges), 2))
        if (a, b) not in seen:
            seen.add((a, b))
            merges.append((a, b, base + len(merges)))
    return merges


@pytest.mark.parametrize("seed", range(40))
def test_random_tables_and_sequences_merge_as_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = int(rng.integers(2, 12))
    merges = random_merges(rng, base, int(rng.integers(1, 3 * base)))
    merger = PairMerger(merges, base + len(merges))
    for _ in range(50):
        ids = rng.integers(0, base, int(rng.integers(0, 80)))
        assert merger(ids).tolist() == reference_merge(ids.tolist(), merges)
        assert ids.dtype == np.int64  # the input is left as it was


def test_no_merges_leaves_the_ids() -> None:
    ids = np.array([3, 1, 2], dtype=np.int64)
    assert PairMerger([], 4)(ids).tolist() == [3, 1, 2]


@pytest.mark.parametrize("method,max_n", [("static", 2), ("bpe", 6)])
def test_real_builds_on_random_sequences(method: str, max_n: int) -> None:
    """Sequences drawn from the ids the merges use, so that most pairs merge."""
    tok = smollm2_medtpe(method, max_n)
    merger = PairMerger(tok.merges, tok.vocab_size)
    used = np.unique(np.array(tok.merges)[:, :2])
    rng = np.random.default_rng(0)
    for _ in range(300):
        ids = rng.choice(used, int(rng.integers(0, 200)))
        assert merger(ids).tolist() == reference_merge(ids.tolist(), tok.merges)


def real_records(n: int) -> list[str]:
    """`n` ICU records of the shared MIMIC-IV demo (8,192 base tokens at most), rendered."""
    labels = read_labels(SHARED_MEDS / "labels" / "icu_mortality.parquet")
    rows = labels[:: max(1, len(labels) // n)][:n]
    subjects = [row.subject_id for row in rows]
    table = pq.read_table(SHARED_MEDS / "data", filters=[("subject_id", "in", subjects)])
    dataset = MedsDataset(SHARED_MEDS, table, read_code_descriptions(SHARED_MEDS), {})
    return [
        render_record(
            dataset.events(row.subject_id),
            dataset.descriptions,
            row.prediction_time,
            base_tokenizer(),
            8192,
        ).text
        for row in rows
    ]


def synthetic_and_real_records() -> list[str]:
    """Synthetic ICU records, and real ones where the shared data is on this machine."""
    return icu_records(6) + (real_records(3) if SHARED_MEDS.is_dir() else [])


@pytest.mark.parametrize("method,max_n", [("static", 2), ("bpe", 6)])
def test_records_merge_as_the_reference(method: str, max_n: int) -> None:
    tok = smollm2_medtpe(method, max_n)
    for text in synthetic_and_real_records():
        unmerged = tok.encode_ids(tok.base_encode(text), merge=False)
        assert tok.encode_ids(tok.base_encode(text), plain_tail=0) == reference_merge(
            unmerged, tok.merges
        )
