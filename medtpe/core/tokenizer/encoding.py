"""Vectorised id rewriting after the base BPE: evicted-token decomposition and TPE pair merging.

Both steps run on numpy arrays, so the per-token cost stays a small fraction of the base
tokenizer's (see docs/benchmarks.md). `ByteFallback` spells the characters a byte-level
vocabulary has no bytes for (the base tokenizer drops them).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np


class IdExpansion:
    """Replaces chosen ids by id sequences (all other ids map to themselves), vectorised."""

    def __init__(self, mapping: Mapping[int, Sequence[int]], size: int) -> None:
        lengths = np.ones(size, dtype=np.int64)
        self._mask = np.zeros(size, dtype=bool)
        for i, seq in mapping.items():
            lengths[i] = len(seq)
            self._mask[i] = True
        self._lengths = lengths
        self._starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        flat = np.arange(size, dtype=np.int64).repeat(lengths)  # placeholder values
        for i, seq in mapping.items():
            flat[self._starts[i] : self._starts[i] + len(seq)] = seq
        self._flat = flat

    def lengths(self, ids: np.ndarray) -> np.ndarray:
        """How many ids each of `ids` expands to (1 for an id left as it is)."""
        return self._lengths[ids]

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        """The expanded id array (the input itself when nothing needs expanding)."""
        if ids.size == 0 or not self._mask[ids].any():
            return ids
        lens = self._lengths[ids]
        ends = np.cumsum(lens)
        offsets = np.repeat(self._starts[ids] - (ends - lens), lens)
        return self._flat[np.arange(ends[-1]) + offsets]


class PairMerger:
    """Greedy left-to-right merging of adjacent id pairs, one pass per merge level.

    In each pass every adjacent pair found in the merge table is a candidate; within a run of
    overlapping candidates the 1st, 3rd, 5th... are merged (what a left-to-right scan does).
    A pass can only create pairs of the next level, so the work is O(n × merge depth).
    """

    def __init__(self, merges: Sequence[tuple[int, int, int]], vocab_size: int) -> None:
        self._stride = np.int64(vocab_size)
        keys = np.array([a * vocab_size + b for a, b, _ in merges], dtype=np.int64)
        order = np.argsort(keys)
        self._keys = keys[order]
        self._new_ids = np.array([m[2] for m in merges], dtype=np.int64)[order]
        self._is_left = np.zeros(vocab_size, dtype=bool)
        self._is_right = np.zeros(vocab_size, dtype=bool)
        for a, b, _ in merges:
            self._is_left[a] = True
            self._is_right[b] = True
        self._max_passes = merge_depth(merges) + 1

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        """The merged id array."""
        if not len(self._keys):
            return ids
        for _ in range(self._max_passes):
            if ids.size < 2:
                break
            left, right = ids[:-1], ids[1:]
            cand = np.flatnonzero(self._is_left[left] & self._is_right[right])
            if not cand.size:
                break
            query = left[cand] * self._stride + right[cand]
            slot = np.searchsorted(self._keys, query)
            slot[slot == len(self._keys)] = 0
            hit = self._keys[slot] == query
            pos = cand[hit]
            if not pos.size:
                break
            new_ids = self._new_ids[slot[hit]]
            # index of each candidate inside its run of consecutive candidate positions
            run_start = np.ones(pos.size, dtype=bool)
            run_start[1:] = pos[1:] != pos[:-1] + 1
            idx = np.arange(pos.size)
            first = np.maximum.accumulate(np.where(run_start, idx, 0))
            take = ((idx - first) & 1) == 0
            sel = pos[take]
            out = ids.copy()
            out[sel] = new_ids[take]
            keep = np.ones(ids.size, dtype=bool)
            keep[sel + 1] = False
            ids = out[keep]
        return ids


def merge_depth(merges: Sequence[tuple[int, int, int]]) -> int:
    """Longest chain of merges feeding one another."""
    depth: dict[int, int] = {}
    for a, b, new in merges:
        depth[new] = max(depth.get(a, 0), depth.get(b, 0)) + 1
    return max(depth.values(), default=0)


def utf8_char_pattern(byte_values: Iterable[int]) -> re.Pattern[str] | None:
    """A regex matching runs of characters whose UTF-8 encoding holds any of `byte_values`
    (None when no character does). Built from numpy over all code points (tens of ms), once per
    set of bytes in a process (every load of an artefact asks for the same)."""
    return _utf8_char_pattern(frozenset(byte_values))


@functools.lru_cache(maxsize=8)
def _utf8_char_pattern(byte_values: frozenset[int]) -> re.Pattern[str] | None:
    wanted = np.zeros(256, dtype=bool)
    wanted[list(byte_values)] = True
    cp = np.arange(0x110000, dtype=np.int64)
    cp = cp[(cp < 0xD800) | (cp > 0xDFFF)]  # surrogates have no UTF-8 encoding
    n = 1 + (cp >= 0x80) + (cp >= 0x800) + (cp >= 0x10000)
    lead = np.select(
        [n == 1, n == 2, n == 3],
        [cp, 0xC0 | (cp >> 6), 0xE0 | (cp >> 12)],
        0xF0 | (cp >> 18),
    )
    hit = wanted[lead]
    for k in range(1, 4):  # continuation byte k of n: bits 6 * (n - 1 - k) upwards
        shift = np.maximum(6 * (n - 1 - k), 0)
        hit |= (n > k) & wanted[0x80 | ((cp >> shift) & 0x3F)]
    chars = cp[hit]
    if not chars.size:
        return None
    breaks = np.flatnonzero(np.diff(chars) != 1)
    starts = chars[np.concatenate(([0], breaks + 1))]
    ends = chars[np.concatenate((breaks, [chars.size - 1]))]
    ranges = "".join(
        f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}"
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
    )
    return re.compile(f"([{ranges}]+)")


class ByteFallback:
    """Ids for characters the base vocabulary cannot spell: each UTF-8 byte of such a character
    becomes its fallback id (bytes the base lacks) or its byte-level symbol's base id."""

    def __init__(self, fallback: Mapping[int, int], byte_ids: Mapping[int, int]) -> None:
        self.fallback = dict(fallback)
        self._ids = {**byte_ids, **self.fallback}
        self.pattern = utf8_char_pattern(self.fallback)

    def ids(self, chars: str) -> list[int]:
        """The ids of a run of characters matched by `pattern`."""
        return [self._ids[b] for b in chars.encode("utf-8")]
