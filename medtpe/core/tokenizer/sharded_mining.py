"""Mining a MEDS dataset shard by shard: render and count n-grams per data shard (in worker
processes with `workers` > 1, or in Ray Data tasks on a Ray cluster with `ray_address`), then
merge the count tables in shard order.

Memory: the merged table (one row per distinct n-gram) plus the shards in flight; never the
whole dataset. The merged counts, the compression sample (the first records in shard order) and
so the artefact do not depend on the number of workers nor on the backend (docs/scaling.md).
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from pathlib import Path

from tqdm import tqdm

from medtpe.core.meds.readers import MedsFormatError, data_shards
from medtpe.core.tokenizer.base import BaseTokenizer
from medtpe.core.tokenizer.corpus import CorpusSpec, ShardCorpus, check_label_subjects
from medtpe.core.tokenizer.mining import NgramCounter, NgramCounts, encode_batches, merge_counts

SAMPLE_TOKENS = 2_000_000  # corpus tokens kept to report a build's compression
_IN_FLIGHT_PER_WORKER = 2  # shards submitted ahead per worker (bounds the results held)


@dataclass(frozen=True)
class MiningJob:
    """What each shard's worker does: render `spec`'s records, encode them with the base
    tokenizer at `tokenizer_file`, count n-grams up to `max_n`; keep every record's ids with
    `keep_records` (BPE selection needs them), else the first `sample_tokens` tokens' records."""

    spec: CorpusSpec
    tokenizer_file: Path
    max_n: int
    keep_records: bool = False
    sample_tokens: int = SAMPLE_TOKENS

    def resolved(self) -> MiningJob:
        """This job with absolute paths (workers of a cluster need not share the driver's
        working directory)."""
        spec = self.spec
        labels = spec.labels.resolve() if spec.labels is not None else None
        spec = replace(spec, meds_dir=spec.meds_dir.resolve(), labels=labels)
        return replace(self, spec=spec, tokenizer_file=self.tokenizer_file.resolve())


@dataclass
class ShardCounts:
    """One shard's (or the merged corpus's) counts, kept records and subjects."""

    counts: NgramCounts
    records: list[list[int]] = field(default_factory=list)
    subjects: list[int] = field(default_factory=list)


@lru_cache(maxsize=2)
def _base(tokenizer_file: Path) -> BaseTokenizer:
    return BaseTokenizer.load(tokenizer_file)


def count_shard(job: MiningJob, shard: Path) -> ShardCounts:
    """Render, encode and count one data shard (the map step)."""
    base = _base(job.tokenizer_file)
    corpus = ShardCorpus(job.spec, shard)
    counter = NgramCounter(base.vocab_size, job.max_n)
    records: list[list[int]] = []
    for batch in encode_batches(base, corpus.texts(base)):
        if job.keep_records or counter.counts.n_tokens < job.sample_tokens:
            records.extend(batch)
        counter.add(batch)
    return ShardCounts(counter.result(), records, corpus.subject_ids)


def merge_shard_counts(total: ShardCounts | None, part: ShardCounts, job: MiningJob) -> ShardCounts:
    """The reduce step: counts added, records kept (up to the sample), subjects checked."""
    if total is None:
        return part
    overlap = set(total.subjects).intersection(part.subjects)
    if overlap:
        raise MedsFormatError(
            f"{job.spec.meds_dir}: subject {min(overlap)} is in more than one data shard "
            "(MEDS keeps each subject in one shard)"
        )
    n_kept = sum(map(len, total.records))
    if job.keep_records or n_kept < job.sample_tokens:
        total.records.extend(part.records)
    merge_counts(total.counts, part.counts)
    total.subjects.extend(part.subjects)
    return total


def _single_thread_tokenizers() -> None:
    """Worker initialiser: one tokenizer thread per worker process (the workers are the
    parallelism)."""
    os.environ["RAYON_NUM_THREADS"] = "1"


def _ordered_map(
    fn: Callable[[Path], ShardCounts],
    shards: Sequence[Path],
    workers: int,
    ray_address: str | None = None,
) -> Iterator[ShardCounts]:
    """`fn` over `shards`, results in shard order; on the Ray cluster at `ray_address` when
    given, else in-process for one worker, else in `workers` spawned processes with a bounded
    number of shards in flight."""
    if ray_address is not None:
        from medtpe.core.tokenizer.ray_mining import (
            ray_ordered_map,
        )  # Ray: the optional `ray` extra

        yield from ray_ordered_map(fn, shards, ray_address)
        return
    if workers <= 1:
        yield from map(fn, shards)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, context, _single_thread_tokenizers) as pool:
        pending: deque[Future[ShardCounts]] = deque()
        todo = iter(shards)
        for shard in todo:
            pending.append(pool.submit(fn, shard))
            if len(pending) >= workers * _IN_FLIGHT_PER_WORKER:
                break
        while pending:
            result = pending.popleft().result()
            if (shard := next(todo, None)) is not None:
                pending.append(pool.submit(fn, shard))
            yield result


def count_meds_corpus(
    job: MiningJob, workers: int = 1, progress: bool = True, ray_address: str | None = None
) -> tuple[NgramCounts, list[list[int]]]:
    """Counts of the whole corpus and the kept records (the sample, or all with
    `keep_records`), mined shard by shard with `workers` processes, or on the Ray cluster at
    `ray_address` ("local": a new local cluster)."""
    if ray_address is not None:
        job = job.resolved()
    shards = data_shards(job.spec.meds_dir)
    total: ShardCounts | None = None
    bar = tqdm(total=len(shards), desc="Mining shards", unit="shard", disable=not progress)
    for part in _ordered_map(partial(count_shard, job), shards, workers, ray_address):
        total = merge_shard_counts(total, part, job)
        bar.update(1)
        bar.set_postfix(tokens=f"{total.counts.n_tokens:,}")
    bar.close()
    if total is None:  # data_shards raises first; kept for the type checker
        raise MedsFormatError(f"{job.spec.meds_dir}: no data shards")
    check_label_subjects(job.spec, set(total.subjects))
    return total.counts, total.records
