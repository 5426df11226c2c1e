"""Build a MedTPE tokenizer from a base tokenizer and a domain corpus."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from medtpe.core.metrics.scores import compression_rate
from medtpe.core.tokenizer.base import BaseTokenizer
from medtpe.core.tokenizer.corpus import CorpusSpec
from medtpe.core.tokenizer.medtpe_tokenizer import MedTPETokenizer
from medtpe.core.tokenizer.mining import (
    Merge,
    Ngram,
    NgramCounter,
    NgramCounts,
    encode_batches,
    select_bpe,
    select_static,
)
from medtpe.core.tokenizer.replacement import MergeGraph, choose_evictions, single_char_ids
from medtpe.core.tokenizer.sharded_mining import SAMPLE_TOKENS, MiningJob, count_meds_corpus

METHODS = ("static", "bpe")
DEFAULT_METHOD = "static"  # wins on held-out ICU records at N = 2 (docs/benchmarks.md)


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
    _check_method(method)
    started = time.perf_counter()
    base = base if isinstance(base, BaseTokenizer) else BaseTokenizer.load(base)
    counter = NgramCounter(base.vocab_size, _counted_n(method, max_n))
    kept: list[list[int]] = []
    for batch in encode_batches(base, texts, progress=progress):
        if method == "bpe" or counter.counts.n_tokens < SAMPLE_TOKENS:
            kept.extend(batch)
        counter.add(batch)
    settings = build_settings(method, budget, max_n, min_freq, protected_texts)
    return build_from_counts(
        base, counter.result(), kept, settings, protected_texts, progress, started
    )


def build_tokenizer_from_meds(
    base_path: Path,
    spec: CorpusSpec,
    budget: int,
    max_n: int = 2,
    method: str = DEFAULT_METHOD,
    protected_texts: Sequence[str] = (),
    min_freq: int = 2,
    workers: int = 1,
    progress: bool = True,
    ray_address: str | None = None,
) -> MedTPETokenizer:
    """`build_tokenizer` on a MEDS dataset's records (`spec`), rendered and counted shard by
    shard in `workers` processes, or on the Ray cluster at `ray_address` ("local": a new local
    cluster); the artefact is the same for any number of workers and either backend.
    `base_path`: a tokenizer.json or a model directory (its tokenizer files go along)."""
    _check_method(method)
    started = time.perf_counter()
    base = BaseTokenizer.load(base_path)
    job = MiningJob(spec, base.path or base_path, _counted_n(method, max_n), method == "bpe")
    counts, kept = count_meds_corpus(job, workers, progress, ray_address)
    settings = build_settings(method, budget, max_n, min_freq, protected_texts)
    return build_from_counts(base, counts, kept, settings, protected_texts, progress, started)


def default_protected_texts(base_path: Path) -> list[str]:
    """Texts whose tokens are never evicted: every task's prompt scaffolding (in every layout)
    and system prompt, and the chat template of the model directory `base_path` (none for a
    tokenizer.json)."""
    from medtpe.core.prompt.layout import PromptLayout, user_message
    from medtpe.core.tasks import get_task, list_tasks

    texts = []
    for name in list_tasks():
        task = get_task(name)
        texts += [user_message(layout, task, "") for layout in PromptLayout]
        if task.system_prompt:
            texts.append(task.system_prompt)
    if base_path.is_dir():
        texts.extend(p.read_text() for p in base_path.glob("chat_template.jinja"))
        config = base_path / "tokenizer_config.json"
        if config.is_file():
            template = json.loads(config.read_text()).get("chat_template")
            if isinstance(template, str):
                texts.append(template)
    return texts


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")


def _counted_n(method: str, max_n: int) -> int:
    """The longest n-gram to count: `max_n` for static selection, unigrams only for BPE."""
    return max_n if method == "static" else 1


def build_settings(
    method: str, budget: int, max_n: int, min_freq: int, protected: Sequence[str]
) -> dict[str, Any]:
    """The settings an artefact records (and `build_from_counts` selects with)."""
    return {
        "method": method,
        "budget": budget,
        "max_n": max_n,
        "min_freq": min_freq,
        "n_protected_texts": len(protected),
    }


def build_from_counts(
    base: BaseTokenizer,
    counts: NgramCounts,
    kept: list[list[int]],
    settings: dict[str, Any],
    protected_texts: Sequence[str],
    progress: bool = False,
    started: float | None = None,
) -> MedTPETokenizer:
    """Select the new tokens from corpus `counts` (BPE: from the `kept` records, all of them),
    evict base tokens for them and the missing bytes, and report the compression on `kept`
    (and the build time since `started`, a `time.perf_counter()` value, when given)."""
    string_of = _token_strings(base)
    budget, max_n, min_freq = settings["budget"], settings["max_n"], settings["min_freq"]
    if settings["method"] == "static":
        chosen = select_static(counts, budget, string_of, min_freq)
        merges: list[Merge] = [(g[:-1], g[-1:]) for g in chosen]
    else:
        n_symbols = int(np.count_nonzero(counts.unigrams))
        line_ends = frozenset(i for i in range(base.vocab_size) if "\n" in base.decode([i]))
        merges = select_bpe(
            kept, budget, max_n, string_of, n_symbols, line_ends, min_freq, progress
        )

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
    settings = {**settings, "n_protected_ids": len(protected)}
    tok = MedTPETokenizer(base, table, evicted, settings, byte_fallback=byte_fallback)
    n_sample = sum(map(len, kept))
    n_compressed = sum(len(tok.encode_ids(record)) for record in kept)
    tok.corpus_stats.update(
        n_records=counts.n_records,
        n_tokens=counts.n_tokens,
        sample_tokens=n_sample,
        sample_compression_rate=compression_rate(n_sample, n_compressed),
        evicted_corpus_frequency=int(sum(counts.unigrams[i] for i in evicted)),
    )
    if started is not None:
        tok.corpus_stats["build_seconds"] = round(time.perf_counter() - started, 2)
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
