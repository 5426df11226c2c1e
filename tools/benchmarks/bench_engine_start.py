"""An engine start in a fresh interpreter, with vLLM's worker process and without.

Each run is a fresh Python process (`--child`) pinned to `--cores` (one core: how a `make test`
worker runs an engine), with `VLLM_ENABLE_V1_MULTIPROCESSING` set to the run's value (`1`: the
model in a worker process of its own; `0`: in the engine core, the engine wrapper's default on a
small machine, medtpe/inference/cpu_cores.py). It times the imports, `VllmEngine.start` (default
model, eager, float32, 1 GiB KV cache) and a first greedy `generate` of the same 300 ids, and
compares the generated ids of every run:

    .venv/bin/python -m tools.benchmarks.bench_engine_start --multiprocessing 1 0 --cores 0 \\
        --out tools/benchmarks/results/bench_engine_start.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tools.benchmarks.results_file import write_results

MODEL = Path(".cache/models/smollm2-135m-instruct")
PROMPT = list(range(1000, 1300))
"""The same 300 ids for every run."""


def child(model: Path) -> None:
    """One run in this process: print its timings and answer as JSON."""
    import asyncio

    started = time.perf_counter()
    from medtpe.inference.engines.protocol import EngineConfig, EngineOptions, GenerationParams
    from medtpe.inference.engines.vllm_engine import VllmEngine

    imported = time.perf_counter() - started
    options = EngineOptions(kv_cache_gib=1, enforce_eager=True, dtype="float32")
    engine = VllmEngine.start(EngineConfig(model, max_model_len=2048, options=options))
    ready = time.perf_counter() - started

    async def first() -> list[int]:
        return (await engine.generate(PROMPT, GenerationParams(max_new_tokens=8)))[0].ids

    ids = asyncio.run(first())
    done = time.perf_counter() - started
    print(json.dumps({"import_s": imported, "ready_s": ready, "first_answer_s": done, "ids": ids}))
    engine.shutdown()


def main() -> None:
    """Run each setting in a fresh interpreter, one after the other; write the results file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multiprocessing", nargs="+", choices=["0", "1"], default=["1", "0"])
    parser.add_argument("--cores", default="0", help="the runs' allowed cores, e.g. 0 or 0,1")
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.model)
        return
    cores = {int(c) for c in args.cores.split(",")}
    runs = []
    for value in args.multiprocessing:
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": value}
        command = [sys.executable, "-m", "tools.benchmarks.bench_engine_start", "--child"]
        command += ["--model", str(args.model)]
        done = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            preexec_fn=lambda: os.sched_setaffinity(0, cores),
        )
        line = next(x for x in done.stdout.splitlines() if x.startswith('{"import_s"'))
        run = json.loads(line)
        runs.append({"multiprocessing": value, **run})
        print(json.dumps(runs[-1]), flush=True)
    same = all(run["ids"] == runs[0]["ids"] for run in runs)
    results = {"cores": sorted(cores), "runs": runs, "same_answer_ids": same}
    write_results(
        args.out,
        " ".join(["python -m tools.benchmarks.bench_engine_start", *sys.argv[1:]]),
        results,
    )


if __name__ == "__main__":
    main()
