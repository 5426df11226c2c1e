"""Build a MedTPE tokenizer from a base tokenizer and a domain corpus."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from medtpe_core.base_tokenizer import BaseTokenizer
from medtpe_core.mining import (
    Merge,
    Ngram,
    NgramCounter,
    encode_batches,
    select_bpe,
    select_static,
)
from medtpe_core.replacement import MergeGraph, choose_evictions, single_char_ids
from medtpe_core.tokenizer import MedTPETokenizer

METHODS = ("static", "bpe")
DEFAULT_METHOD = "static"  # wins on held-out ICU records at N = 2 (docs/benchmarks.md)
_SAMPLE_TOKENS = 2_000_000  # corpus tokens kept to report the build's compression


def build_tokenizer(
    base: str | Path | BaseTokenizer,
    texts: Iterable[str],
    budget: int,
    max_n: int = 2,
    method: str = DEFAULT_METHOD,
    protected_texts: Sequence[str] = (),
    min_freq: int = 2,
    progress: bool = True,
) -> MedTPETokenizer:
    """Mine up to `budget` TPE tokens of 2..`max_n` base tokens from `texts` and give them the ids
    of the cheapest evictable base tokens. Tokens of `protected_texts` (task prompts, the chat
    template) are never evicted."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    started = time.perf_counter()
    base = base if isinstance(base, BaseTokenizer) else BaseTokenizer.load(base)
    string_of = _token_strings(base)
    counter = NgramCounter(base.vocab_size, max_n if method == "static" else 1)
    sample: list[list[int]] = []
    kept: list[list[int]] = []
    for batch in encode_batches(base, texts, progress=progress):
        counter.add(batch)
        if method == "bpe":
            kept.extend(batch)
        elif counter.counts.n_tokens - sum(map(len, batch)) < _SAMPLE_TOKENS:
            sample.extend(batch)
    counts = counter.result()
    if method == "static":
        chosen = select_static(counts, budget, string_of, min_freq)
        merges: list[Merge] = [(g[:-1], g[-1:]) for g in chosen]
    else:
        n_symbols = int(np.count_nonzero(counts.unigrams))
        line_ends = frozenset(i for i in range(base.vocab_size) if "\n" in base.decode([i]))
        merges = select_bpe(
            kept, budget, max_n, string_of, n_symbols, line_ends, min_freq, progress
        )
        sample = kept

    graph = MergeGraph(base)
    dependent = graph.ancestry({i for left, right in merges for i in left + right})
    protected = dependent | base.special_ids | single_char_ids(base)
    for text in protected_texts:
        protected.update(base.encode(text, special_tokens=True), base.encode(text))
    evicted = choose_evictions(graph, counts.unigrams, protected, len(merges))

    ids: dict[Ngram, int] = {}
    table = []
    for (left, right), new_id in zip(merges, sorted(evicted), strict=True):
        table.append((ids.get(left, left[0]), ids.get(right, right[0]), new_id))
        ids[left + right] = new_id
    settings = {
        "method": method,
        "budget": budget,
        "max_n": max_n,
        "min_freq": min_freq,
        "n_protected_texts": len(protected_texts),
        "n_protected_ids": len(protected),
    }
    tok = MedTPETokenizer(base, table, evicted, settings)
    n_sample = sum(map(len, sample))
    n_compressed = sum(len(tok.encode_ids(ids)) for ids in sample)
    tok.corpus_stats.update(
        n_records=counts.n_records,
        n_tokens=counts.n_tokens,
        sample_tokens=n_sample,
        sample_compression_rate=1 - n_compressed / n_sample if n_sample else 0.0,
        evicted_corpus_frequency=int(sum(counts.unigrams[i] for i in evicted)),
        build_seconds=round(time.perf_counter() - started, 2),
    )
    return tok


def _token_strings(base: BaseTokenizer) -> Callable[[Ngram], str | None]:
    """`string_of(ngram)`: the vocabulary string a new token would get, None if forbidden
    (it holds a special token, or the string is already a base token's)."""
    vocab = base.tokenizer.get_vocab(with_added_tokens=True)
    by_id = {i: s for s, i in vocab.items()}
    special = base.special_ids

    def string_of(ngram: Ngram) -> str | None:
        if special.intersection(ngram):
            return None
        string = "".join(by_id[i] for i in ngram)
        return None if string in vocab else string

    return string_of
