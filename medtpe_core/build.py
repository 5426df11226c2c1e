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
    missing = base.missing_bytes()
    evicted = choose_evictions(graph, counts.unigrams, protected, len(merges) + len(missing))
    order = list(evicted)  # eviction order: the M cheapest for new tokens, the next for bytes
    byte_fallback = dict(zip(missing, sorted(order[len(merges) :]), strict=True))

    ids: dict[Ngram, int] = {}
    table = []
    for (left, right), new_id in zip(merges, sorted(order[: len(merges)]), strict=True):
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
    tok = MedTPETokenizer(base, table, evicted, settings, byte_fallback=byte_fallback)
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


def add_byte_fallback(
    tok: MedTPETokenizer,
    texts: Iterable[str] | None = None,
    protected_texts: Sequence[str] = (),
    progress: bool = False,
) -> MedTPETokenizer:
    """`tok` with byte fallback: one more evicted base token for each byte its base vocabulary
    lacks (see `BaseTokenizer.missing_bytes`). New tokens, their ids and the earlier evictions are
    kept. Artefacts store no corpus frequencies: with `texts` the evicted tokens are the cheapest
    on them (as in a build), without, the latest base merges (rarest in the base's own training
    text). Tokens of `protected_texts` and every new token's merge path are never evicted.
    Returns `tok` itself when nothing is missing or the fallback is already there."""
    base = tok.base
    missing = [b for b in base.missing_bytes() if b not in tok.byte_fallback]
    if not missing:
        return tok
    if tok.byte_fallback:
        raise ValueError("the artefact's byte fallback does not cover its base's missing bytes")
    graph = MergeGraph(base)
    dependent = graph.ancestry({i for t in tok.new_tokens for i in t.constituents})
    protected = dependent | base.special_ids | single_char_ids(base)
    for text in protected_texts:
        protected.update(base.encode(text, special_tokens=True), base.encode(text))
    counter = NgramCounter(base.vocab_size, 1)
    for batch in encode_batches(base, texts or (), progress=progress):
        counter.add(batch)
    added = choose_evictions(graph, counter.result().unigrams, protected, len(missing), tok.evicted)
    gone = tok.evicted.keys() | added.keys()
    evicted = {i: graph.decompose(i, gone) for i in [*tok.evicted, *added]}
    stats = dict(tok.corpus_stats)
    if texts is not None:
        stats["byte_fallback_corpus_frequency"] = int(
            sum(counter.counts.unigrams[i] for i in added)
        )
    return MedTPETokenizer(
        base,
        tok.merges,
        evicted,
        tok.settings,
        stats,
        dict(zip(missing, sorted(added), strict=True)),
    )


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
