"""Service latency and throughput, `medtpe` vs `original` mode, on real MIMIC-IV demo records.

For each mode a `medtpe serve` process is started (same settings but the mode), then requests are
sent at concurrency 1, 4 and 16 (each request one distinct ICU stay: no two requests share a
record, so the prefix cache only ever serves the task instruction every prompt starts with;
both modes get the same records in the same order). Reported per mode and concurrency:
client-side latency p50/p95, throughput (records/s over the level's wall time), mean prompt and
answer tokens, mean server-side generation time. Other service settings come from the
environment (`MEDTPE_ARTEFACT_DIR`, ...) and are recorded in the JSON output.

    .venv/bin/python benchmarks/bench_service.py --meds ../shared/data/mimic-iv-demo-meds
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


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    """Run both modes, print a Markdown table, write JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meds", type=Path, default=Path("../shared/data/mimic-iv-demo-meds"))
    parser.add_argument("--max-input-tokens", type=int, default=2048)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--per-level", type=int, nargs=3, default=(4, 16, 32), metavar="N")
    parser.add_argument("--modes", nargs="+", default=["medtpe", "original"])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_service.json"))
    args = parser.parse_args()

    bodies = load_bodies(args.meds, sum(args.per_level))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    for mode in args.modes:
        port = free_port()
        env = {
            "MEDTPE_MODE": mode,
            "MEDTPE_MAX_INPUT_TOKENS": str(args.max_input_tokens),
            "MEDTPE_MAX_NEW_TOKENS": str(args.max_new_tokens),
            "MEDTPE_CODES_DIR": str(args.meds.resolve()),
        }
        process = start_service(env, port, args.out.with_name(f"bench_service_{mode}.log"))
        try:
            offset = 0
            for level, n in zip(LEVELS, args.per_level, strict=True):
                level_bodies = bodies[offset : offset + n]
                offset += n
                result = asyncio.run(run_level(f"http://127.0.0.1:{port}", level_bodies, level))
                result["mode"] = mode
                results.append(result)
                print(json.dumps(result), flush=True)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(120)
    args.out.write_text(
        json.dumps(
            {
                "machine": f"{platform.platform()}, {os.cpu_count()} CPUs",
                "args": vars(args),
                "environment": {k: v for k, v in os.environ.items() if k.startswith("MEDTPE_")},
                "results": results,
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
        cells = (
            r["mode"],
            r["concurrency"],
            r["records"],
            f"{r['p50_s']:.2f}",
            f"{r['p95_s']:.2f}",
            f"{r['throughput_rps']:.3f}",
            f"{prompt:.0f}",
            f"{r['mean_generated_tokens']:.1f}",
            f"{r['mean_generate_ms']:.0f}",
        )
        print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
