"""Mining synthetic MEDS shards on a local Ray cluster (Ray Data tasks, `--ray`) against the
worker-process path (`--workers`), with the same number of CPUs: wall time, tokens/s, peak
memory and the artefact id of each, in one run.

    .venv/bin/python -m benchmarks.bench_mining_ray --shards 76 --cpus 2 \\
        --out benchmarks/results/mining_ray_76shards.json

The shards are the mining benchmark's (`bench_tokenizer_data.write_shards`: the MIMIC-IV demo's
events once per shard, subjects renumbered, digits rotated; 76 shards are about 508 M SmolLM2
tokens). Each backend runs in a fresh process (`medtpe_core.build.build_tokenizer_from_meds`,
static, N = 2); the local Ray cluster is started inside the timed run (`ray.init` with `--cpus`
CPUs, no dashboard), the worker processes are spawned inside it. Memory: the run's peak RSS
summed over its whole process tree (driver, Ray's own processes and workers, or the worker
processes; shared pages such as Ray's object store are counted in every process that maps
them), sampled every 0.5 s, and the driver's own peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.bench_tokenizer_data import smollm2_tokenizer, write_shards
from benchmarks.results_file import write_results
from medtpe_core.paths import cache_dir, project_root

BACKENDS = ("workers", "ray")


class TreePeakRss:
    """Peak summed RSS of a process and its descendants, sampled in a thread."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        self.root = psutil.Process(pid)
        self.every_s = every_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            total = 0
            for process in processes:
                try:
                    total += process.memory_info().rss
                except psutil.Error:
                    continue
            self.peak = max(self.peak, total)
            self._stop.wait(self.every_s)

    def stop(self) -> float:
        """Stop sampling; the peak in MiB."""
        self._stop.set()
        self._thread.join()
        return round(self.peak / 2**20, 1)


def mine(meds: Path, backend: str, cpus: int, max_n: int, budget: int) -> dict[str, Any]:
    """One mining run of `backend` with `cpus` CPUs (called in a fresh process); its figures."""
    from medtpe_core.build import build_tokenizer_from_meds
    from medtpe_core.corpus import CorpusSpec

    tokenizer = smollm2_tokenizer()
    started = time.perf_counter()
    if backend == "ray":
        import ray

        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        options: dict[str, Any] = {"ray_address": "local"}  # reuses the session just started
    else:
        options = {"workers": cpus}
    tok = build_tokenizer_from_meds(tokenizer, CorpusSpec(meds), budget, max_n, "static", **options)
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
    command = [sys.executable, "-m", "benchmarks.bench_mining_ray", "--mine", str(meds)]
    command += ["--backends", backend, "--cpus", str(args.cpus)]
    command += ["--max-n", str(args.max_n), "--budget", str(args.budget)]
    load = psutil.getloadavg()[0]
    child = subprocess.Popen(command, cwd=project_root(), stdout=subprocess.PIPE, text=True)
    memory = TreePeakRss(child.pid)
    stdout, _ = child.communicate()
    peak = memory.stop()
    if child.returncode != 0:
        raise SystemExit(f"{backend} run failed ({child.returncode})")
    run = json.loads(stdout.strip().splitlines()[-1])
    run |= {"peak_rss_tree_mib": peak, "load_before": round(load, 2)}
    run["load_after"] = round(psutil.getloadavg()[0], 2)
    print(json.dumps(run), flush=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shards", type=int, default=8, help="synthetic data shards")
    parser.add_argument("--cpus", type=int, default=2, help="worker processes / Ray CPUs")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
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
    runs = [run_backend(meds, backend, args) for backend in args.backends]
    ids = {run["artefact_id"] for run in runs}
    results = {
        "shards": args.shards,
        "max_n": args.max_n,
        "budget": args.budget,
        "runs": runs,
        "same_artefact_id": len(ids) == 1,
        "same_n_tokens": len({run["n_tokens"] for run in runs}) == 1,
    }
    if len(runs) == 2:
        results["ray_over_workers_seconds"] = round(runs[1]["seconds"] / runs[0]["seconds"], 3)
    print(json.dumps(results, indent=1))
    write_results(
        args.out, " ".join(["python -m benchmarks.bench_mining_ray", *sys.argv[1:]]), results
    )


if __name__ == "__main__":
    main()
