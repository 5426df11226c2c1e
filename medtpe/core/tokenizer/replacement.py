"""Dependency-aware replacement: which base tokens give their ids to the new TPE tokens."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

import numpy as np

from medtpe.core.tokenizer.base import BaseTokenizer


class MergeGraph:
    """The base BPE merges as a graph: token id -> (left parent, right parent) and its rank."""

    def __init__(self, base: BaseTokenizer) -> None:
        vocab = base.tokenizer.get_vocab(with_added_tokens=False)
        self.parents: dict[int, tuple[int, int]] = {}
        self.rank: dict[int, int] = {}
        for rank, (left, right) in enumerate(base.merges()):
            child = vocab.get(left + right)
            if child is None or child in self.parents or left not in vocab or right not in vocab:
                continue
            self.parents[child] = (vocab[left], vocab[right])
            self.rank[child] = rank

    def ancestry(self, ids: Iterable[int]) -> set[int]:
        """`ids` and every token on their merge paths, recursively down the base merges."""
        seen: set[int] = set()
        stack = list(ids)
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            stack.extend(self.parents.get(i, ()))
        return seen

    def decompose(self, i: int, evicted: set[int] | Mapping[int, object]) -> tuple[int, ...]:
        """Split `i` into its merge parents, recursively, until no part is evicted."""
        if i not in evicted:
            return (i,)
        left, right = self.parents[i]
        return self.decompose(left, evicted) + self.decompose(right, evicted)


def single_char_ids(base: BaseTokenizer) -> set[int]:
    """Ids whose vocabulary string is one character (single bytes in byte-level BPE)."""
    vocab = base.tokenizer.get_vocab(with_added_tokens=False)
    return {i for s, i in vocab.items() if len(s) == 1}


def choose_evictions(
    graph: MergeGraph,
    unigrams: np.ndarray,
    protected: set[int],
    count: int,
    already: Iterable[int] = (),
) -> dict[int, tuple[int, ...]]:
    """Evict `count` decomposable, unprotected base tokens with the lowest corpus cost
    frequency × (decomposition length − 1); ties go to the latest base merge (rarest in the base
    tokenizer's own training text). `already`: ids evicted before (not candidates, and split in
    the decompositions). Returns evicted id -> decomposition into surviving ids, in eviction
    order (the first k of a larger `count` are what `count=k` chooses)."""
    freq = unigrams.tolist()

    evicted: dict[int, tuple[int, ...]] = dict.fromkeys(already, ())
    chosen: list[int] = []

    def cost(i: int) -> int:
        left, right = graph.parents[i]
        n_parts = len(graph.decompose(left, evicted)) + len(graph.decompose(right, evicted))
        return freq[i] * (n_parts - 1)

    heap = [
        (cost(i), -graph.rank[i], i)
        for i in graph.parents
        if i not in protected and i not in evicted
    ]
    heapq.heapify(heap)
    while heap and len(chosen) < count:
        c, neg_rank, i = heapq.heappop(heap)
        current = cost(i)
        if current != c:  # parents evicted since: its cost grew
            heapq.heappush(heap, (current, neg_rank, i))
            continue
        evicted[i] = ()
        chosen.append(i)
    if len(chosen) < count:
        raise ValueError(f"only {len(chosen)} base tokens can be evicted, {count} needed")
    return {i: graph.decompose(i, evicted) for i in chosen}
