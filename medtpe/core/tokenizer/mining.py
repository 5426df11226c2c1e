"""TPE vocabulary discovery: streamed n-gram counting and the two selection methods.

N-grams are runs of 2..max_n adjacent base token ids inside one record, crossing word
boundaries. `select_static` is the paper's scoring (frequency × N with the reference code's
prefix-overlap decrement); `select_bpe` learns merges that re-count after each merge (BPE over
token ids, run by the Rust BPE trainer of `tokenizers` on one character per base id).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from tokenizers import Tokenizer, models, trainers
from tqdm import tqdm

from medtpe.core.tokenizer.base import BaseTokenizer, merge_pair

Ngram = tuple[int, ...]
# a learned merge: the flattened base ids of its left and right parts
Merge = tuple[Ngram, Ngram]

_SURROGATES = 0xE000 - 0xD800
_COMPACT_ROWS = 4_000_000  # pending unique n-grams per length before they are folded together


def encode_batches(
    base: BaseTokenizer, texts: Iterable[str], batch_size: int = 64, progress: bool = False
) -> Iterator[list[list[int]]]:
    """Base ids of `texts`, a batch of records at a time (streamed)."""
    bar = tqdm(desc="Tokenizing corpus", unit="rec", disable=not progress)
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == batch_size:
            yield base.encode_batch(batch)
            bar.update(len(batch))
            batch = []
    if batch:
        yield base.encode_batch(batch)
        bar.update(len(batch))
    bar.close()


@dataclass
class NgramCounts:
    """Corpus statistics: unigram counts per id and n-gram counts per length (keys packed)."""

    vocab_size: int
    max_n: int
    n_records: int = 0
    n_tokens: int = 0
    unigrams: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ngrams: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def unpack(self, key: int, n: int) -> Ngram:
        """The ids of a packed n-gram key."""
        out = []
        for _ in range(n):
            key, rest = divmod(key, self.vocab_size)
            out.append(rest)
        return tuple(reversed(out))


class NgramCounter:
    """Counts n-grams of base ids in bounded memory: per batch `np.unique`, folded periodically."""

    def __init__(self, vocab_size: int, max_n: int) -> None:
        if max_n < 1:
            raise ValueError("max_n must be at least 1 (1: unigram counts only)")
        if vocab_size**max_n >= 2**63:
            raise ValueError(f"max_n={max_n} is too large for a vocabulary of {vocab_size} ids")
        self.counts = NgramCounts(vocab_size, max_n, unigrams=np.zeros(vocab_size, dtype=np.int64))
        self._pending: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {
            n: [] for n in range(2, max_n + 1)
        }

    def add(self, records: Sequence[Sequence[int]]) -> None:
        """Count the n-grams of a batch of records (lists of base ids)."""
        counts = self.counts
        sentinel = counts.vocab_size  # separates records; no n-gram may contain it
        parts: list[np.ndarray] = []
        for ids in records:
            parts.append(np.asarray(ids, dtype=np.int64))
            parts.append(np.array([sentinel], dtype=np.int64))
            counts.n_tokens += len(ids)
        counts.n_records += len(records)
        if not parts:
            return
        arr = np.concatenate(parts)
        counts.unigrams += np.bincount(arr[arr != sentinel], minlength=counts.vocab_size)
        seps = np.concatenate(([0], np.cumsum(arr == sentinel)))
        for n in range(2, counts.max_n + 1):
            if arr.size < n:
                continue
            starts = np.flatnonzero(seps[n:] == seps[: arr.size - n + 1])
            keys = np.zeros(starts.size, dtype=np.int64)
            for k in range(n):
                keys = keys * counts.vocab_size + arr[starts + k]
            pending = self._pending[n]
            pending.append(np.unique(keys, return_counts=True))
            if sum(p[0].size for p in pending) > _COMPACT_ROWS:
                self._pending[n] = [_fold(pending)]

    def result(self) -> NgramCounts:
        """All counts so far."""
        for n, pending in self._pending.items():
            if pending:
                self._pending[n] = [_fold(pending)]
                self.counts.ngrams[n] = self._pending[n][0]
        return self.counts


def merge_counts(total: NgramCounts, part: NgramCounts) -> NgramCounts:
    """`total` with `part`'s counts added (count tables of two corpus pieces, same base)."""
    if (total.vocab_size, total.max_n) != (part.vocab_size, part.max_n):
        raise ValueError("count tables of different vocabularies or n-gram lengths")
    total.n_records += part.n_records
    total.n_tokens += part.n_tokens
    total.unigrams = total.unigrams + part.unigrams
    for n, table in part.ngrams.items():
        total.ngrams[n] = _fold([total.ngrams[n], table]) if n in total.ngrams else table
    return total


def _fold(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    keys, inverse = np.unique(np.concatenate([p[0] for p in parts]), return_inverse=True)
    counts = np.bincount(inverse, weights=np.concatenate([p[1] for p in parts]))
    return keys, counts.astype(np.int64)


def select_static(
    counts: NgramCounts,
    budget: int,
    string_of: Callable[[Ngram], str | None],
    min_freq: int = 2,
) -> list[Ngram]:
    """The paper's selection: highest frequency × N first, lowering the score of candidates that
    extend a chosen n-gram (reference code); an n-gram longer than 2 brings its prefixes along
    (each prefix is a token of its own, counted in the budget). Prefixes precede extensions.

    `string_of` gives a candidate's vocabulary string, or None when it may not become a token;
    two tokens never share a string."""
    freq: dict[Ngram, int] = {}
    for n, (keys, cnts) in counts.ngrams.items():
        keep = cnts >= min_freq
        for key, c in zip(keys[keep].tolist(), cnts[keep].tolist(), strict=True):
            freq[counts.unpack(key, n)] = c
    score = {g: f * len(g) for g, f in freq.items()}
    extensions: dict[Ngram, list[Ngram]] = {}
    for g in freq:
        for k in range(2, len(g)):
            extensions.setdefault(g[:k], []).append(g)
    heap = [(-s, g) for g, s in score.items()]
    heapq.heapify(heap)
    chosen: list[Ngram] = []
    chosen_set: set[Ngram] = set()
    taken: set[str | None] = {None}
    while heap and len(chosen) < budget:
        neg, g = heapq.heappop(heap)
        if g in chosen_set or -neg != score[g]:
            continue  # stale heap entry
        chain = [g[:k] for k in range(2, len(g) + 1) if g[:k] not in chosen_set]
        if len(chosen) + len(chain) > budget:
            continue
        strings = [string_of(c) for c in chain]
        if taken.intersection(strings) or len(set(strings)) < len(strings):
            continue
        taken.update(strings)
        for c in chain:
            chosen.append(c)
            chosen_set.add(c)
            for ext in extensions.get(c, ()):
                if ext not in chosen_set:
                    score[ext] -= freq[ext] * len(c)
                    heapq.heappush(heap, (-score[ext], ext))
    return chosen


def id_char(i: int) -> str:
    """The one character standing for base id `i` in the BPE trainer's input."""
    c = 0x100 + i
    return chr(c if c < 0xD800 else c + _SURROGATES)


def char_id(ch: str) -> int:
    """Inverse of `id_char`."""
    c = ord(ch)
    return (c if c < 0xD800 else c - _SURROGATES) - 0x100


def select_bpe(
    records: Iterable[Sequence[int]],
    budget: int,
    max_n: int,
    string_of: Callable[[Ngram], str | None],
    n_symbols: int,
    line_ends: frozenset[int] = frozenset(),
    min_freq: int = 2,
    progress: bool = False,
) -> list[Merge]:
    """BPE over base ids across word boundaries: learn merges, re-counting pairs after each one.

    `n_symbols` bounds the number of distinct ids in `records` (the trainer's alphabet).
    Records are cut into lines after each id of `line_ends` (newline tokens), the newline token
    kept at the end of its line and repeated at the start of the next, so pairs on both sides of
    it are still learned while the trainer's per-merge rescans stay short.
    A merge whose token may not exist (`string_of` gives None, or an earlier token has the same
    string) is dropped with every later merge built on it.
    """
    trainer = trainers.BpeTrainer(
        vocab_size=n_symbols + budget + max(budget // 5, 50),
        min_frequency=min_freq,
        max_token_length=max_n + 1,  # the trainer keeps tokens shorter than this (measured)
        show_progress=progress,
        special_tokens=[],
    )
    bpe = Tokenizer(models.BPE())
    lines = (line for ids in records for line in _lines(ids, line_ends))
    bpe.train_from_iterator(("".join(map(id_char, ids)) for ids in lines), trainer=trainer)
    merges: list[Merge] = []
    known: set[str] = set()
    taken: set[str | None] = {None}
    for raw in json.loads(bpe.to_str())["model"]["merges"]:
        left, right = merge_pair(raw)
        if len(merges) == budget:
            break
        parts = [p for p in (left, right) if len(p) > 1]
        if not all(p in known for p in parts):
            continue  # built on a dropped merge
        merge = (tuple(map(char_id, left)), tuple(map(char_id, right)))
        if len(left) + len(right) > max_n:
            continue
        string = string_of(merge[0] + merge[1])
        if string not in taken:
            merges.append(merge)
            known.add(left + right)
            taken.add(string)
    return merges


def _lines(ids: Sequence[int], line_ends: frozenset[int]) -> Iterator[Sequence[int]]:
    start = 0
    for k, i in enumerate(ids):
        if i in line_ends and k > start:
            yield ids[start : k + 1]
            start = k
    if start < len(ids):
        yield ids[start:]
