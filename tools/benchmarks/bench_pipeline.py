"""Everything the service does around the engine, per record: read and validate the JSON body,
render within the budget, tokenize (original + MedTPE), answer — with the engine excluded.

The app is the real one (`medtpe.service.app.create_app`, default settings but the budget, body
limit, API keys and ledger file below), driven in-process over ASGI by httpx; generation is the fake
engine `medtpe.inference.engines.instant.InstantEngine`, which answers every prompt at once with a
fixed well-formed answer.
Per record the off-engine time is the request's wall time minus the engine's `generate` time
the service reports; CPU time per record is the process's CPU time (all threads) over the call.

The ledger is the default kind, a SQLite file (new for each run), written before each answer;
`--ledger-share` runs the same passes again with `MEDTPE_LEDGER_OFF` and reports the per-record
difference. Per record the worker writes a SHA-256 of the prompt text and both id lists
(`Predictor.prepare` on the body as the API decodes it; the MedTPE ids checked against those the
engine received); `--digests-against` counts the records whose digest equals an earlier results
file's (the same prompts before and after a change to the code).

One run measures this checkout's code, each pass in a fresh worker process, on the same request
bodies (the comparison with an older tree, `--old-src`, was retired: its figures stay in
tools/benchmarks/results/bench_pipeline.json; run an older tree's copy of this file from its own
directory instead):
- every ICU stay of the label file (events up to the prediction time, as a hospital would send
  them), or with `--split` those of one split of the subject split (`held_out`), two passes:
  `cold` (first sight of every record in a fresh process) and `warm` (`--warm-passes`, pooled);
- API-process scaling: `--processes 1 2 ...` copies of the new code each serving every record
  (warm pass), at once: records/s in total;
- linearity: the `--scale-records` stays closest to the median size, their events repeated 1x,
  4x and 16x further back in time;
- the real launcher: `--api-workers 1 2 ...` starts `medtpe serve` with `MEDTPE_API_WORKERS` = N
  on the real vLLM engine (eager, 1 GiB KV cache) and sends every stay to `POST /tokenize`
  (read, validate, render, tokenize both ways, answer both token lists; no generation) from one
  client process at `--client-concurrency` (fresh connections, so the kernel spreads them over
  the processes): one cold pass, then `LAUNCHER_WARM_PASSES` warm passes timed together.

    .venv/bin/python -m tools.benchmarks.bench_pipeline --meds ../shared/data/mimic-iv-demo-meds \
        --out tools/benchmarks/results/bench_pipeline.json
    .venv/bin/python -m tools.benchmarks.bench_pipeline --meds ../shared/data/mimic-iv-demo-meds \
        --split held_out --warm-passes 3 --ledger-share --processes --scale-records 0 \
        --out tools/benchmarks/results/bench_pipeline_held_out.json
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from medtpe.core.meds.subject_split import SPLIT_NAMES
from medtpe.core.paths import project_root
from tools.benchmarks.results_file import write_results

BUDGET = 8192
TASK = "icu_mortality"
LEDGER_OFF = "off"
"""A worker's ledger argument for `MEDTPE_LEDGER_OFF` (else a ledger URL)."""
SCALES = (1, 4, 16)
LAUNCHER_WARM_PASSES = 5


# ---------------------------------------------------------------- worker process


async def _serve_all(paths: list[Path], passes: int, ledger: str) -> dict[str, Any]:
    import httpx

    from medtpe.inference.engines.instant import InstantEngine
    from medtpe.service.app import create_app
    from medtpe.service.settings import ServiceSettings

    settings = ServiceSettings(
        max_input_tokens=BUDGET,
        max_request_bytes=1 << 30,
        api_keys=[],
        **({"ledger_off": True} if ledger == LEDGER_OFF else {"ledger_url": ledger}),
    )
    app = create_app(settings, InstantEngine.factory())
    transport = httpx.ASGITransport(app=app)
    headers = {"content-type": "application/json"}
    out: dict[str, Any] = {"wall_s": [], "passes": []}
    client = httpx.AsyncClient(transport=transport, base_url="http://bench")
    async with app.router.lifespan_context(app), client:
        while (await client.get("/readyz")).status_code != 200:
            await asyncio.sleep(0.1)
        for _ in range(passes):
            rows, pass_start = [], time.perf_counter()
            for path in paths:
                raw = path.read_bytes()
                cpu0, wall0 = time.process_time(), time.perf_counter()
                response = await client.post("/predict", content=raw, headers=headers)
                wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
                if response.status_code != 200:
                    raise RuntimeError(f"{path.name}: {response.status_code} {response.text}")
                body = response.json()
                latency = body["latency_ms"]
                rows.append(
                    {
                        "off_engine_ms": wall * 1e3 - latency["generate"],
                        "cpu_ms": cpu * 1e3,
                        "render_ms": latency["render"],
                        "tokenize_ms": latency["tokenize"],
                        "events": body["events"]["total"],
                        "kept": body["events"]["kept"],
                        "tokens": body["tokens"]["original"],
                        "medtpe_tokens": body["tokens"]["medtpe"],
                        "bytes": len(raw),
                    }
                )
            out["wall_s"].append(time.perf_counter() - pass_start)
            out["passes"].append(rows)
        state = app.state.service
        out["digests"] = _digests(paths, state.model.predictor, state.engine.prompts[-len(paths) :])
    return out


def _digests(paths: list[Path], predictor: Any, engine_ids: list[list[int]]) -> list[str]:
    """Per body, the SHA-256 of what the service made of it: the prompt text, its original ids
    and its MedTPE ids (`Predictor.prepare`, as `/predict` calls it, on the body as the API
    decodes and validates it); each record's MedTPE ids checked against what the engine got
    for it in the last pass."""
    from medtpe.core.tasks import get_task
    from medtpe.inference.record import MedsRecord
    from medtpe.service.plumbing.json_body import decode_body
    from medtpe.service.predict.schemas import PredictRequest

    out = []
    for path, sent in zip(paths, engine_ids, strict=True):
        request = PredictRequest.model_validate(decode_body(path.read_bytes()))
        record = MedsRecord(request.events, request.prediction_time)
        prepared = record.prepare(predictor, get_task(request.task))
        seg = prepared.segmentation
        if predictor.engine_ids(seg) != sent:
            raise RuntimeError(f"{path.name}: the engine got other ids than the prompt's")
        digest = hashlib.sha256(prepared.prompt.text.encode())
        digest.update(json.dumps([seg.original_ids, seg.medtpe_ids]).encode())
        out.append(digest.hexdigest())
    return out


def worker(bodies: Path, names: list[str], passes: int, ledger: str, out: Path) -> None:
    """Serve the named bodies `passes` times with `ledger` (a ledger URL, or `LEDGER_OFF`); write
    each pass's wall time and per-record rows, and each record's digest."""
    done = asyncio.run(_serve_all([bodies / name for name in names], passes, ledger))
    out.write_text(json.dumps(done))


# ---------------------------------------------------------------- parent


def _run_workers(
    bodies: Path, names: list[str], passes: int, copies: int = 1, ledger: bool = True
) -> list[dict[str, Any]]:
    """`copies` worker processes at once, recording into one new SQLite ledger (the default
    kind; `ledger` False: `MEDTPE_LEDGER_OFF`); their outputs."""
    outs = [Path(tempfile.mkstemp(suffix=".json")[1]) for _ in range(copies)]
    names_file = Path(tempfile.mkstemp(suffix=".json")[1])
    names_file.write_text(json.dumps(names))
    with tempfile.TemporaryDirectory() as ledger_dir:
        url = f"sqlite:///{ledger_dir}/ledger.sqlite3" if ledger else LEDGER_OFF
        command = [sys.executable, "-m", "tools.benchmarks.bench_pipeline", "--worker", str(bodies)]
        command += [str(names_file), str(passes), url]
        procs = [subprocess.Popen([*command, str(o)], cwd=project_root()) for o in outs]
        if any(p.wait() != 0 for p in procs):
            raise RuntimeError("a worker process failed")
    return [json.loads(o.read_text()) for o in outs]


async def _post_all(url: str, paths: list[Path], concurrency: int) -> list[float]:
    """POST every body to `url` keeping `concurrency` in flight (a fresh connection each, so
    the kernel spreads them over the API processes); per-request latency in seconds."""
    import httpx

    todo = [path.read_bytes() for path in paths]
    latencies: list[float] = []
    headers = {"content-type": "application/json"}
    fresh = httpx.Limits(max_keepalive_connections=0)

    async def sender(client: httpx.AsyncClient) -> None:
        while todo:
            raw = todo.pop()
            start = time.perf_counter()
            response = await client.post(url, content=raw, headers=headers)
            if response.status_code != 200:
                raise RuntimeError(f"{response.status_code} {response.text[:500]}")
            latencies.append(time.perf_counter() - start)

    async with httpx.AsyncClient(timeout=600, limits=fresh) as client:
        await asyncio.gather(*(sender(client) for _ in range(concurrency)))
    return latencies


def _through_launcher(
    bodies: Path, names: list[str], workers: int, concurrency: int
) -> dict[str, Any]:
    """`medtpe serve` with `workers` API processes; every body to /tokenize, cold then warm."""
    from medtpe.inference.model import ModelConfig
    from medtpe.training.export import prepare_model_files
    from tools.benchmarks.bench_service import free_port, start_service

    prepare_model_files(ModelConfig())  # the default model and export the service loads
    port = free_port()
    env = {
        "MEDTPE_API_WORKERS": str(workers),
        "MEDTPE_MAX_INPUT_TOKENS": str(BUDGET),
        "MEDTPE_MAX_REQUEST_BYTES": str(1 << 30),
        "MEDTPE_ENFORCE_EAGER": "true",
        "MEDTPE_KV_CACHE_GIB": "1",
        "MEDTPE_API_KEYS": "",
    }
    log = Path(tempfile.mkstemp(suffix=".log")[1])
    process = start_service(env, port, log)
    paths = [bodies / name for name in names]
    url = f"http://127.0.0.1:{port}/tokenize"
    try:
        asyncio.run(_post_all(url, paths, concurrency))  # cold: every process's caches fill
        cpu0, start = time.process_time(), time.perf_counter()
        latencies = asyncio.run(_post_all(url, paths * LAUNCHER_WARM_PASSES, concurrency))
        wall, client_cpu = time.perf_counter() - start, time.process_time() - cpu0
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(120)
    ms = np.array(latencies) * 1e3
    return {
        "records": len(latencies),
        "client_concurrency": concurrency,
        "records_per_s": round(len(latencies) / wall, 1),
        "latency_ms_p50": round(float(np.percentile(ms, 50)), 1),
        "latency_ms_p95": round(float(np.percentile(ms, 95)), 1),
        "client_cpu_s": round(client_cpu, 1),
        "wall_s": round(wall, 1),
    }


def _stats(rows: list[dict[str, float]]) -> dict[str, Any]:
    off = np.array([r["off_engine_ms"] for r in rows])
    cpu = np.array([r["cpu_ms"] for r in rows])
    return {
        "n": len(rows),
        "off_engine_ms_p50": round(float(np.percentile(off, 50)), 2),
        "off_engine_ms_p95": round(float(np.percentile(off, 95)), 2),
        "off_engine_ms_max": round(float(off.max()), 2),
        "render_ms_p50": round(float(np.median([r["render_ms"] for r in rows])), 2),
        "tokenize_ms_p50": round(float(np.median([r["tokenize_ms"] for r in rows])), 2),
        "render_tokenize_ms_p50": round(
            float(np.median([r["render_ms"] + r["tokenize_ms"] for r in rows])), 2
        ),
        "cpu_ms_mean": round(float(cpu.mean()), 2),
        "records_per_cpu_s": round(1e3 / float(cpu.mean()), 1),
        "events_p50": int(np.median([r["events"] for r in rows])),
        "tokens_p50": int(np.median([r["tokens"] for r in rows])),
        "medtpe_tokens_p50": int(np.median([r["medtpe_tokens"] for r in rows])),
    }


def _write_bodies(
    meds: Path, out: Path, n_scale: int, split: str | None
) -> tuple[dict[str, str], dict[int, list[str]]]:
    """Request bodies: every labelled stay of `split` (None: all) by its key
    (`subject_id@prediction_time`), and the scaled copies of `n_scale` median stays."""
    from tools.benchmarks.bench_service import to_json_events
    from tools.benchmarks.label_stays import label_stays

    names, sizes, events_of = {}, [], []
    for i, (row, subject_events) in enumerate(label_stays(meds, TASK, split)):
        events = to_json_events(subject_events)
        when = row.prediction_time.isoformat()
        body = {"task": TASK, "events": events, "prediction_time": when}
        (out / f"stay{i}.json").write_text(json.dumps(body))
        names[f"{row.subject_id}@{when}"] = f"stay{i}.json"
        sizes.append(len(events))
        events_of.append((body, events))
    median = np.median(sizes)
    chosen = sorted(range(len(sizes)), key=lambda i: abs(sizes[i] - median))[:n_scale]
    scaled: dict[int, list[str]] = {s: [] for s in SCALES}
    for i in chosen:
        body, events = events_of[i]
        for scale in SCALES:
            name = f"stay{i}x{scale}.json"
            (out / name).write_text(json.dumps({**body, "events": _repeated(events, scale)}))
            scaled[scale].append(name)
    return names, scaled


def _repeated(events: list[dict[str, Any]], times: int) -> list[dict[str, Any]]:
    """The timed events `times` times, each earlier copy a year further back; statics once."""
    static = [e for e in events if e["time"] is None]
    timed = [e for e in events if e["time"] is not None]
    out = list(static)
    for k in range(times - 1, -1, -1):
        shift = np.timedelta64(366 * k, "D")
        for e in timed:
            when = np.datetime64(e["time"]) - shift
            out.append({**e, "time": str(when.astype("datetime64[s]"))})
    return out


def _pipeline(args: argparse.Namespace, bodies: Path, names: dict[str, str]) -> dict[str, Any]:
    """Every stay through `/predict` (cold, then `--warm-passes` warm passes pooled), each
    record's digest, and with `--ledger-share` the same passes with the ledger off."""
    files = list(names.values())
    passes = 1 + args.warm_passes
    run = _run_workers(bodies, files, passes)[0]
    warm = [row for rows in run["passes"][1:] for row in rows]
    out: dict[str, Any] = {
        "records": len(files),
        "warm_passes": args.warm_passes,
        "cold": _stats(run["passes"][0]),
        "warm": _stats(warm),
        "digests": dict(zip(names, run["digests"], strict=True)),
    }
    if args.ledger_share:
        off = _run_workers(bodies, files, passes, ledger=False)[0]
        if off["digests"] != run["digests"]:
            raise RuntimeError("the same records gave other prompts with the ledger off")
        off_warm = [row for rows in off["passes"][1:] for row in rows]
        pairs = zip(warm, off_warm, strict=True)
        written = [on["off_engine_ms"] - no["off_engine_ms"] for on, no in pairs]
        out["ledger_off"] = {"cold": _stats(off["passes"][0]), "warm": _stats(off_warm)}
        out["ledger_write_ms_warm"] = {
            "p50": round(float(np.percentile(written, 50)), 2),
            "p95": round(float(np.percentile(written, 95)), 2),
            "share_of_off_engine_p50": round(
                float(np.percentile(written, 50)) / out["warm"]["off_engine_ms_p50"], 3
            ),
        }
    if args.digests_against:
        before = json.loads(args.digests_against.read_text())["results"]["pipeline"]["digests"]
        common = [key for key in out["digests"] if key in before]
        out["digests_against"] = {
            "file": str(args.digests_against),
            "records_compared": len(common),
            "records_identical": sum(before[k] == out["digests"][k] for k in common),
        }
    return out


def _linearity(bodies: Path, scaled: dict[int, list[str]]) -> dict[str, Any]:
    """The scaled stays (warm pass) at each scale."""
    linear = {}
    for scale in SCALES:
        rows = _run_workers(bodies, scaled[scale], passes=2)[0]["passes"][1]
        linear[f"x{scale}"] = _stats(rows)
    return linear


def _scaling(bodies: Path, files: list[str], processes: list[int]) -> dict[str, Any]:
    """Records/s over `copies` API processes serving every stay at once (warm passes)."""
    scaling = {}
    for copies in processes:
        outs = _run_workers(bodies, files, passes=2, copies=copies)
        warm_s = max(o["wall_s"][1] for o in outs)  # the copies' warm passes overlap
        scaling[str(copies)] = {
            "records_per_s_total": round(len(files) * copies / warm_s, 1),
            "off_engine_ms_p50": _stats([r for o in outs for r in o["passes"][1]])[
                "off_engine_ms_p50"
            ],
        }
        print("processes", copies, scaling[str(copies)], flush=True)
    return scaling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--meds", type=Path, required=True)
    parser.add_argument(
        "--split",
        choices=SPLIT_NAMES,
        help="only the stays of this split (medtpe.core.meds.subject_split); default: every one",
    )
    parser.add_argument("--warm-passes", type=int, default=1)
    parser.add_argument(
        "--ledger-share",
        action="store_true",
        help="also the same passes with MEDTPE_LEDGER_OFF: what the ledger write costs",
    )
    parser.add_argument(
        "--digests-against",
        type=Path,
        help="an earlier results file: how many of the same stays gave the same prompt and ids",
    )
    parser.add_argument("--processes", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--scale-records", type=int, default=6, help="0: no linearity runs")
    parser.add_argument(
        "--api-workers", type=int, nargs="*", default=[], help="MEDTPE_API_WORKERS values to run"
    )
    parser.add_argument("--client-concurrency", type=int, default=4)
    parser.add_argument("--launcher-only", action="store_true", help="only the --api-workers runs")
    parser.add_argument("--limit", type=int, help="only the first N stays (a smoke run)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {
        "budget": BUDGET,
        "split": args.split or "all",
        "engine": "InstantEngine (answers at once)",
        "load_avg_before": [round(x, 2) for x in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory() as tmp:
        bodies = Path(tmp)
        names, scaled = _write_bodies(args.meds, bodies, args.scale_records, args.split)
        names = dict(list(names.items())[: args.limit])
        files = list(names.values())
        launcher = {}
        for workers in args.api_workers:
            launcher[str(workers)] = _through_launcher(
                bodies, files, workers, args.client_concurrency
            )
            print("api workers", workers, launcher[str(workers)], flush=True)
        if launcher:
            results["api_workers_tokenize"] = {
                "engine": "vLLM behind the real launcher (POST /tokenize generates nothing)",
                **launcher,
            }
        if args.launcher_only:
            del results["engine"]
            write_results(args.out, " ".join(sys.argv), results)
            return
        results["pipeline"] = _pipeline(args, bodies, names)
        shown = {k: v for k, v in results["pipeline"].items() if k != "digests"}
        print("pipeline", json.dumps(shown), flush=True)
        if args.scale_records:
            results["pipeline"]["linearity"] = _linearity(bodies, scaled)
            print("linearity", json.dumps(results["pipeline"]["linearity"]), flush=True)
        if args.processes:
            results["api_processes"] = _scaling(bodies, files, args.processes)
    write_results(args.out, " ".join(sys.argv), results)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        bodies_dir, names_file, n_passes, ledger_url, out_file = sys.argv[2:7]
        worker(
            Path(bodies_dir),
            json.loads(Path(names_file).read_text()),
            int(n_passes),
            ledger_url,
            Path(out_file),
        )
    else:
        main()
