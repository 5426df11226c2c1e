"""`MEDTPE_API_WORKERS=2`: two API processes in front of one real vLLM engine core.

Checked on a real `medtpe serve`: both processes warm up through the one engine core, requests
spread over both are answered, `/metrics` from either process counts every request of both,
one caller's repeats hit the prefix cache whichever process serves them (one cache-salt secret
for all processes), and SIGTERM drains a request in flight before everything exits.
"""

from __future__ import annotations

import re
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.service_support import (
    SERVICE_API_KEY,
    ServiceProcess,
    metric_value,
    service_env,
    synthetic_events,
)

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(900)]

N_PROCESSES = 2
N_PREDICT = 8
N_TOKENIZE = 24
N_REPEATS = 6
BLOCK_TOKENS = 128
"""vLLM's KV-cache block on CPU: prefix-cache hits come in whole blocks."""
HEADERS = {"X-API-Key": SERVICE_API_KEY}


def ready_pids(metrics_text: str) -> dict[int, float]:
    """The per-process `medtpe_engine_ready` series: pid -> value."""
    series = re.findall(r'^medtpe_engine_ready\{pid="(\d+)"\} (\S+)$', metrics_text, re.M)
    return {int(pid): float(value) for pid, value in series}


def wait_all_ready(server: ServiceProcess) -> dict[int, float]:
    """Poll `/metrics` until every API process reports ready (each warmed up on the engine)."""
    server.wait_ready()
    for _ in range(300):
        pids = ready_pids(httpx.get(server.url + "/metrics").text)
        if len(pids) == N_PROCESSES and all(v == 1.0 for v in pids.values()):
            return pids
        threading.Event().wait(1)
    raise TimeoutError(f"not every API process became ready:\n{server.log()[-4000:]}")


def post(server: ServiceProcess, path: str, subject: int, n_events: int = 120) -> httpx.Response:
    """One request about a synthetic record, on a fresh connection."""
    body = {"task": "icu_mortality", "events": synthetic_events(subject, n_events)}
    return httpx.post(server.url + path, json=body, headers=HEADERS, timeout=300)


def test_two_api_processes_share_one_engine(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    env = service_env(
        service_files,
        MEDTPE_API_WORKERS=str(N_PROCESSES),
        MEDTPE_MAX_CONCURRENCY="4",
        MEDTPE_API_KEYS=SERVICE_API_KEY,
    )
    server = ServiceProcess(env, tmp_path / "service.log")
    try:
        pids = wait_all_ready(server)
        supervisor = psutil.Process(server.process.pid)
        assert {psutil.Process(pid).ppid() for pid in pids} == {supervisor.pid}
        assert len(server.engine_core_pids()) == 1

        with ThreadPoolExecutor(8) as pool:
            predicted = list(pool.map(lambda i: post(server, "/predict", i), range(N_PREDICT)))
            tokenized = list(pool.map(lambda i: post(server, "/tokenize", i), range(N_TOKENIZE)))
        for response in predicted + tokenized:
            assert response.status_code == 200, response.text
        assert all(r.json()["tokens"]["medtpe"] < r.json()["tokens"]["original"] for r in predicted)

        # any process answers /metrics with the sums over both; the one engine saw every
        # generation of both processes (their warm-ups included)
        for _ in range(4):
            text = httpx.get(server.url + "/metrics").text
            count = "medtpe_request_latency_seconds_count"
            assert metric_value(text, count, endpoint="predict") == N_PREDICT
            assert metric_value(text, count, endpoint="tokenize") == N_TOKENIZE
            assert (
                metric_value(text, "vllm:request_success_total", finished_reason="stop")
                + (metric_value(text, "vllm:request_success_total", finished_reason="length"))
                == N_PREDICT + N_PROCESSES
            )
            assert metric_value(text, "medtpe_inflight_requests") == 0

        # one caller, one record, fresh connections: every repeat after the first reuses the
        # cached prefix, in whichever process it lands (a salt secret per process would miss)
        hits_before = metric_value(text, "vllm:prefix_cache_hits_total")
        repeats = [post(server, "/predict", 1000) for _ in range(N_REPEATS)]
        prompt_tokens = repeats[0].json()["tokens"]["medtpe"]
        hits = metric_value(httpx.get(server.url + "/metrics").text, "vllm:prefix_cache_hits_total")
        full_blocks = (prompt_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS
        assert hits - hits_before >= (N_REPEATS - 1) * full_blocks, (
            hits - hits_before,
            prompt_tokens,
        )

        # SIGTERM with a request in flight: it is answered, then everything exits
        result: dict[str, httpx.Response] = {}
        slow = threading.Thread(
            target=lambda: result.setdefault("r", post(server, "/predict", 99, 400))
        )
        slow.start()
        for _ in range(3000):
            if metric_value(httpx.get(server.url + "/metrics").text, "medtpe_inflight_requests"):
                break
            threading.Event().wait(0.01)
        children = supervisor.children(recursive=True)
        exit_code = server.stop()
        slow.join()
        assert result["r"].status_code == 200, result["r"].text
        assert exit_code in (0, -signal.SIGTERM), server.log()[-4000:]
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [p.pid for p in alive]
    finally:
        server.stop()
