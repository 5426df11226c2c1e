"""Mining a large corpus in bounded memory: static n-gram counting streamed over many tokens.

Two modes:

    # one stream of pre-rendered text (in-process; the corpus held by the benchmark)
    .venv/bin/python -m tools.benchmarks.bench_tokenizer_scale [--tokens 50000000] [--max-n 2]

    # the product's sharded path: synthetic MEDS shards, rendered + counted per shard
    # (`medtpe.core.tokenizer.build.build_tokenizer_from_meds`), once per worker count, each in a
    # fresh process; results JSON with wall time, tokens/s and peak RSS of the main and worker
    # processes
    .venv/bin/python -m tools.benchmarks.bench_tokenizer_scale --shards 8 --workers 1 2 \\
        --out tools/benchmarks/results/mining_workers.json

    # the same with as many cores as workers (CPU affinity of the run: cores 0..K-1), so the
    # speed-up in workers is not hidden by one worker's tokenizer threads using every core
    .venv/bin/python -m tools.benchmarks.bench_tokenizer_scale --shards 8 --workers 1 2 \\
        --cores-per-worker --out tools/benchmarks/results/mining_workers_cores.json

The synthetic corpus is the MIMIC-IV demo (all patients' whole histories) repeated with the
digits rotated on each repetition (varied numbers, same structure), so the n-gram table keeps
growing instead of only re-counting; in the sharded mode each shard is one repetition, its
subjects renumbered so that every subject lives in one shard. Reports time and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from medtpe.core.paths import cache_dir
from medtpe.core.tokenizer import BaseTokenizer
from medtpe.core.tokenizer.build import build_tokenizer, build_tokenizer_from_meds
from medtpe.core.tokenizer.corpus import CorpusSpec
from tools.benchmarks.bench_tokenizer_data import (
    icu_split,
    rotation,
    smollm2_tokenizer,
    write_shards,
)


def stream(texts: list[str], passes: int) -> Iterator[str]:
    """`texts` `passes` times, digits rotated per pass (varied numbers, same structure)."""
    for k in range(passes):
        table = rotation(k)
        for text in texts:
            yield text.translate(table) if k else text


def peak_rss_mib(who: int) -> float:
    """Peak resident set size (MiB) of this process or of its largest waited-for child."""
    return resource.getrusage(who).ru_maxrss / 1024


def cpu_seconds(who: int) -> float:
    """User + system CPU time of this process or of its waited-for children."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def mine_shards(meds: Path, workers: int, max_n: int, budget: int, pin: bool) -> dict:
    """One sharded mining run (called in a fresh process); its figures. CPU seconds (main +
    workers) show the work done whatever the machine's load; wall time shows the speed-up.
    With `pin`, the run (and the workers it spawns) may use cores 0..workers-1 only."""
    if pin:
        os.sched_setaffinity(0, range(workers))
    started = time.perf_counter()
    tok = build_tokenizer_from_meds(
        smollm2_tokenizer(), CorpusSpec(meds), budget, max_n, "static", workers=workers
    )
    seconds = time.perf_counter() - started
    stats = tok.corpus_stats
    return {
        "workers": workers,
        "cores": sorted(os.sched_getaffinity(0)),
        "seconds": round(seconds, 1),
        "n_tokens": stats["n_tokens"],
        "n_records": stats["n_records"],
        "tokens_per_second": round(stats["n_tokens"] / seconds),
        "cpu_seconds_main": round(cpu_seconds(resource.RUSAGE_SELF), 1),
        "cpu_seconds_workers": round(cpu_seconds(resource.RUSAGE_CHILDREN), 1),
        "peak_rss_main_mib": round(peak_rss_mib(resource.RUSAGE_SELF)),
        "peak_rss_worker_mib": round(peak_rss_mib(resource.RUSAGE_CHILDREN))
        if workers > 1
        else None,
        "artefact_id": tok.artefact_id,
        "sample_compression_rate": round(stats["sample_compression_rate"], 4),
    }


def sharded(args: argparse.Namespace) -> None:
    """Write the shards, mine them once per worker count (fresh processes), write the JSON."""
    meds = write_shards(args.work, args.shards)
    runs = []
    for workers in args.workers:
        command = [sys.executable, __file__, "--mine", str(meds), "--workers", str(workers)]
        command += ["--max-n", str(args.max_n), "--budget", str(args.budget)]
        command += ["--cores-per-worker"] if args.cores_per_worker else []
        load = os.getloadavg()[0]
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        run = json.loads(done.stdout.strip().splitlines()[-1]) | {"load_before": round(load, 2)}
        run["load_after"] = round(os.getloadavg()[0], 2)
        print(json.dumps(run), flush=True)
        runs.append(run)
    result = {
        "command": " ".join(sys.argv),
        "machine": f"{os.cpu_count()} x {platform.machine()} cores, {platform.platform()}",
        "shards": args.shards,
        "max_n": args.max_n,
        "budget": args.budget,
        "cores_per_worker": args.cores_per_worker,
        "runs": runs,
        "speedup": round(runs[0]["seconds"] / runs[-1]["seconds"], 2) if len(runs) > 1 else None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def in_process(args: argparse.Namespace) -> None:
    """The single-stream mode: pre-rendered text, streamed repeatedly."""
    base = BaseTokenizer.load(smollm2_tokenizer())
    train, test = icu_split(base, held_out_every=10**9)  # every patient
    texts = [t for t in train + test if not re.fullmatch(r"\s*", t)]
    per_pass = sum(map(len, base.encode_batch(texts)))
    passes = -(-args.tokens // per_pass)
    rss_before = peak_rss_mib(resource.RUSAGE_SELF)
    started = time.perf_counter()
    tok = build_tokenizer(base, stream(texts, passes), args.budget, args.max_n, "static")
    seconds = time.perf_counter() - started
    rss = peak_rss_mib(resource.RUSAGE_SELF)
    stats = tok.corpus_stats
    print(
        f"mined {stats['n_tokens']:,} tokens ({passes} passes of {per_pass:,}), "
        f"max_n={args.max_n}, budget={args.budget}: {seconds:.0f} s, "
        f"{stats['n_tokens'] / seconds:,.0f} tokens/s, peak RSS {rss:,.0f} MiB "
        f"(before mining {rss_before:,.0f} MiB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=50_000_000)
    parser.add_argument("--max-n", type=int, default=2)
    parser.add_argument("--budget", type=int, default=5000)
    parser.add_argument("--shards", type=int, default=0, help="sharded mode: number of shards")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--work", type=Path, default=cache_dir() / "bench" / "mining-shards")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "mining_workers.json"
    )
    parser.add_argument(
        "--cores-per-worker", action="store_true", help="run K workers on K cores (affinity)"
    )
    parser.add_argument("--mine", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mine is not None:
        workers = args.workers[0]
        run = mine_shards(args.mine, workers, args.max_n, args.budget, args.cores_per_worker)
        print(json.dumps(run))
    elif args.shards:
        sharded(args)
    else:
        in_process(args)


if __name__ == "__main__":
    main()
