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

    A pair is looked up in one probe of a row-displacement table (int32, small enough to stay
    in cache): the merges of left id `a` sit at `offset[a] + b` for each right id `b`, where
    `owner` holds `a`. After the first pass
    only the pairs next to a token the previous pass made are looked up: any other pair was
    looked up already and either was no merge or lost its left or right to a merge next to it.
    """

    def __init__(self, merges: Sequence[tuple[int, int, int]], vocab_size: int) -> None:
        self._offset, self._owner, self._new_id = _displacement_table(merges, vocab_size)
        self._in_pair = np.zeros(vocab_size, dtype=bool)
        self._in_pair[np.array([m[:2] for m in merges], dtype=np.int64).ravel()] = True
        self._max_passes = merge_depth(merges) + 1 if merges else 0

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        """The merged ids, as int32 (the input is never written to)."""
        ids = ids.astype(np.int32)  # half the memory traffic of int64 in every gather
        at = None  # the first pass looks up every adjacent pair
        for _ in range(self._max_passes):
            ids, made = self._merge_pass(ids, at)
            if not made.size or not self._in_pair[ids[made]].any():
                break
            at = _pairs_around(made, ids.size)
        return ids

    def _merge_pass(self, ids: np.ndarray, at: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """One pass over the pairs starting at `at` (None: every pair), sorted and distinct:
        the new ids and where the tokens it made are in them."""
        left, right = (ids[:-1], ids[1:]) if at is None else (ids[at], ids[at + 1])
        slot = self._offset[left] + right
        hit = np.flatnonzero(self._owner[slot] == left)
        pos = hit if at is None else at[hit]
        if not pos.size:
            return ids, pos
        take = _run_starts_every_other(pos)
        sel = pos[take]
        keep = np.ones(ids.size, dtype=bool)
        keep[sel + 1] = False
        out = ids[keep]
        made = sel - np.arange(sel.size)  # each merge before it removed one id
        out[made] = self._new_id[slot[hit[take]]]
        return out, made


def _run_starts_every_other(pos: np.ndarray) -> np.ndarray:
    """Mask of the 1st, 3rd, 5th... position of each run of consecutive ones in sorted `pos`."""
    start = np.ones(pos.size, dtype=bool)
    start[1:] = pos[1:] != pos[:-1] + 1
    run_start = np.maximum.accumulate(np.where(start, pos, 0))
    return ((pos - run_start) & 1) == 0


def _pairs_around(made: np.ndarray, size: int) -> np.ndarray:
    """Sorted distinct pair positions (0 .. size - 2) with the token at `made` (sorted) on
    their left or right."""
    at = np.empty(2 * made.size, dtype=np.int64)
    at[0::2] = made - 1
    at[1::2] = made
    distinct = np.ones(at.size, dtype=bool)
    distinct[1:] = at[1:] != at[:-1]
    at = at[distinct]
    return at[(at >= 0) & (at < size - 1)]


def _displacement_table(
    merges: Sequence[tuple[int, int, int]], size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offset, owner, new id) of a row-displacement table of `merges` over ids < `size`: the
    merge (a, b, new) at slot offset[a] + b, owner[slot] = a, no two merges in one slot.

    Rows of several merges go first, largest first, each at the first offset where it fits from
    the previous row's on; rows of one merge are appended after the others' slots, one each."""
    rows: dict[int, list[int]] = {}
    for a, b, _ in merges:
        rows.setdefault(a, []).append(b)
    wide = sorted((a for a in rows if len(rows[a]) > 1), key=lambda a: (-len(rows[a]), a))
    singles = [a for a in rows if len(rows[a]) == 1]
    offset = np.zeros(size, dtype=np.int32)
    used = np.zeros(3 * size, dtype=bool)
    at = 0
    for a in wide:
        right = np.array(rows[a], dtype=np.int64)
        at, used = _first_fit(used, right, size, at)
        offset[a] = at
        used[offset[a] + right] = True
    end = max(int(np.flatnonzero(used).max(initial=-1)) + 1, size)
    offset[singles] = end + np.arange(len(singles)) - [rows[a][0] for a in singles]
    table = np.array(merges, dtype=np.int64).reshape(-1, 3)
    slot = offset[table[:, 0]] + table[:, 1]
    owner = np.full(int(offset.max(initial=0)) + size, size, dtype=np.int32)  # no id is `size`
    owner[slot] = table[:, 0]
    new_id = np.zeros(owner.size, dtype=np.int32)
    new_id[slot] = table[:, 2]
    return offset, owner, new_id


def _first_fit(
    used: np.ndarray, right: np.ndarray, size: int, start: int
) -> tuple[int, np.ndarray]:
    """The smallest offset o >= `start` with no `used[o + b]` for b in `right` (all < `size`),
    and `used`, extended when the search went past its end."""
    block = 64
    while True:
        if start + block + size > used.size:
            used = np.concatenate((used, np.zeros(start + block + size, dtype=bool)))
        clash = used[np.arange(start, start + block)[:, None] + right].any(axis=1)
        if not clash.all():
            return start + int(np.argmin(clash)), used
        start += block


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
        self._bytes = [bytes([b]) for b in sorted(self.fallback)]

    def occurs_in(self, text: str) -> bool:
        """Whether `pattern` matches somewhere in `text`: whether its UTF-8 bytes (surrogates,
        which have none, left out) hold a fallback byte; a byte search per fallback byte, many
        times faster than the regex."""
        data = text.encode("utf-8", "ignore")
        return any(b in data for b in self._bytes)

    def ids(self, chars: str) -> list[int]:
        """The ids of a run of characters matched by `pattern`."""
        return [self._ids[b] for b in chars.encode("utf-8")]
