"""Mining synthetic MEDS shards on a local Ray cluster (Ray Data tasks, `--ray`) against the
worker-process path (`--workers`), with the same number of CPUs: wall time, CPU time, tokens/s,
peak memory and the artefact id of each, in one run.

    .venv/bin/python -m tools.benchmarks.bench_mining_ray --shards 8 --cpus 2 --repeat 2 \\
        --out tools/benchmarks/results/mining_ray_8shards.json

The shards are the mining benchmark's (`bench_tokenizer_data.write_shards`: the MIMIC-IV demo's
events once per shard, subjects renumbered, digits rotated; 76 shards are about 508 M SmolLM2
tokens). Each run is a fresh process (`medtpe.core.tokenizer.build.build_tokenizer_from_meds`,
static, N = 2); the local Ray cluster is started inside the timed run (`ray_session` with `--cpus`
CPUs, no dashboard), the worker processes are spawned inside it; `--repeat` runs the backends
in turn again (wall times on a shared machine move with its load; the CPU seconds much less).
Memory: the run's peak RSS summed over its whole process tree (driver, Ray's own processes and
workers, or the worker processes; shared pages such as Ray's object store are counted in every
process that maps them), sampled every 0.5 s (`tools.benchmarks.process_tree`), and the driver's own
peak RSS. Ray runs its task workers at nice 15 (`os.nice(0)` in a task reads 15 here), so on a
busy machine they yield to processes at nice 0.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from medtpe.core.paths import cache_dir, project_root
from medtpe.core.ray_cluster import LOCAL, ray_session
from tools.benchmarks.bench_tokenizer_data import smollm2_tokenizer, write_shards
from tools.benchmarks.process_tree import TreeSampler
from tools.benchmarks.results_file import write_results

BACKENDS = ("workers", "ray")


def mine(meds: Path, backend: str, cpus: int, max_n: int, budget: int) -> dict[str, Any]:
    """One mining run of `backend` with `cpus` CPUs (called in a fresh process); its figures."""
    from medtpe.core.tokenizer.build import build_tokenizer_from_meds
    from medtpe.core.tokenizer.corpus import CorpusSpec

    tokenizer = smollm2_tokenizer()
    started = time.perf_counter()
    spec = CorpusSpec(meds)
    if backend == "ray":
        with ray_session(LOCAL, num_cpus=cpus):  # the mining reuses this session
            tok = build_tokenizer_from_meds(
                tokenizer, spec, budget, max_n, "static", ray_address=LOCAL
            )
            seconds = time.perf_counter() - started
    else:
        tok = build_tokenizer_from_meds(tokenizer, spec, budget, max_n, "static", workers=cpus)
        seconds = time.perf_counter() - started
    stats = tok.corpus_stats
    return {
        "backend": backend,
        "cpus": cpus,
        "seconds": round(seconds, 1),
        "n_tokens": stats["n_tokens"],
        "n_records": stats["n_records"],
        "tokens_per_second": round(stats["n_tokens"] / seconds),
        "peak_rss_driver_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "artefact_id": tok.artefact_id,
        "sample_compression_rate": round(stats["sample_compression_rate"], 4),
    }


def run_backend(meds: Path, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """`mine` in a fresh process, its process tree's memory sampled from here."""
    command = [sys.executable, "-m", "tools.benchmarks.bench_mining_ray", "--mine", str(meds)]
    command += ["--backends", backend, "--cpus", str(args.cpus)]
    command += ["--max-n", str(args.max_n), "--budget", str(args.budget)]
    load = psutil.getloadavg()[0]
    child = subprocess.Popen(command, cwd=project_root(), stdout=subprocess.PIPE, text=True)
    sampler = TreeSampler(child.pid)
    stdout, _ = child.communicate()
    usage = sampler.stop()
    measured = {"peak_rss_tree_mib": usage.peak_rss_mib, "cpu_seconds_tree": usage.cpu_seconds}
    if child.returncode != 0:
        raise SystemExit(f"{backend} run failed ({child.returncode})")
    run = json.loads(stdout.strip().splitlines()[-1])
    run |= {**measured, "load_before": round(load, 2)}
    run["load_after"] = round(psutil.getloadavg()[0], 2)
    print(json.dumps(run), flush=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shards", type=int, default=8, help="synthetic data shards")
    parser.add_argument("--cpus", type=int, default=2, help="worker processes / Ray CPUs")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument(
        "--repeat", type=int, default=1, help="run the backends in turn this many times"
    )
    parser.add_argument("--max-n", type=int, default=2)
    parser.add_argument("--budget", type=int, default=5000)
    parser.add_argument("--work", type=Path, default=cache_dir() / "bench" / "mining-shards")
    parser.add_argument("--out", type=Path, default=None, help="results JSON")
    parser.add_argument("--mine", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mine is not None:
        run = mine(args.mine, args.backends[0], args.cpus, args.max_n, args.budget)
        print(json.dumps(run))
        return
    meds = args.work / f"{args.shards}-shards"
    write_shards(meds, args.shards)
    runs = [run_backend(meds, b, args) for _ in range(args.repeat) for b in args.backends]
    ids = {run["artefact_id"] for run in runs}
    results = {
        "shards": args.shards,
        "max_n": args.max_n,
        "budget": args.budget,
        "runs": runs,
        "same_artefact_id": len(ids) == 1,
        "same_n_tokens": len({run["n_tokens"] for run in runs}) == 1,
    }
    for name in ("seconds", "cpu_seconds_tree", "peak_rss_tree_mib"):
        best = {b: min(r[name] for r in runs if r["backend"] == b) for b in args.backends}
        results[f"best_{name}"] = best
    print(json.dumps(results, indent=1))
    write_results(
        args.out, " ".join(["python -m tools.benchmarks.bench_mining_ray", *sys.argv[1:]]), results
    )


if __name__ == "__main__":
    main()
