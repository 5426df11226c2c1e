"""One real `medtpe serve` for the module (one engine start): `MEDTPE_API_WORKERS=2`, two API
processes in front of one vLLM engine core, with the stable window and three API keys.

Checked on it, in this order: both processes warm up through the one engine core, requests
spread over both are answered, `/metrics` from either process counts every request of both, one
caller's repeats hit the prefix cache whichever process serves them (one cache-salt secret for
all processes); vLLM's own prefix-cache counters on `/metrics`: a growing record re-scored
hourly under the stable window hits the cache, and API keys never share it (each key's
generations carry their own cache salt); last, SIGTERM drains a request in flight before
everything exits.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import psutil
import pytest

from medtpe.core.tokenizer import MedTPETokenizer
from tests.support.service_support import (
    READY_POLL_S,
    SERVICE_API_KEY,
    ServiceProcess,
    metric_value,
    running_service,
    service_env,
    synthetic_events,
)

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(900)]

N_PROCESSES = 2
N_PREDICT = 8
N_TOKENIZE = 24
N_REPEATS = 6
SHORT_RECORD = 30
"""Events of the requests spread over both processes: a few hundred prompt tokens, several
KV-cache blocks."""
BLOCK_TOKENS = 128
"""vLLM's KV-cache block on CPU: prefix-cache hits come in whole blocks."""
HEADERS = {"X-API-Key": SERVICE_API_KEY}
KEYS = ("tenant-a-key", "tenant-b-key")
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
TASK = "icu_mortality"


def ready_pids(metrics_text: str) -> dict[int, float]:
    """The per-process `medtpe_engine_ready` series: pid -> value."""
    series = re.findall(r'^medtpe_engine_ready\{pid="(\d+)"\} (\S+)$', metrics_text, re.M)
    return {int(pid): float(value) for pid, value in series}


@pytest.fixture(scope="module")
def server(
    service_files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """The module's service (budget 1,024 tokens), once every API process reports ready (each
    warmed up on the engine); the last test stops it."""
    env = service_env(
        service_files,
        MEDTPE_API_WORKERS=str(N_PROCESSES),
        MEDTPE_MAX_CONCURRENCY="4",
        MEDTPE_API_KEYS=",".join((SERVICE_API_KEY, *KEYS)),
        MEDTPE_WINDOW_POLICY="stable",
        MEDTPE_WINDOW_GRID_HOURS="6",
    )
    log = tmp_path_factory.mktemp("api-workers") / "service.log"
    with running_service(env, log) as process:
        for _ in range(int(300 / READY_POLL_S)):
            pids = ready_pids(httpx.get(process.url + "/metrics", headers=HEADERS).text)
            if len(pids) == N_PROCESSES and all(v == 1.0 for v in pids.values()):
                break
            time.sleep(READY_POLL_S)
        else:
            raise TimeoutError(f"not every API process became ready:\n{process.log()[-4000:]}")
        yield process


def post(
    server: ServiceProcess, path: str, subject: int, n_events: int = SHORT_RECORD
) -> httpx.Response:
    """One request about a synthetic record, on a fresh connection."""
    body = {"task": TASK, "events": synthetic_events(subject, n_events)}
    return httpx.post(server.url + path, json=body, headers=HEADERS, timeout=300)


def test_two_api_processes_share_one_engine(server: ServiceProcess) -> None:
    """Runs first: the counts include both processes' warm-ups and nothing else."""
    pids = ready_pids(httpx.get(server.url + "/metrics", headers=HEADERS).text)
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
        text = httpx.get(server.url + "/metrics", headers=HEADERS).text
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
    hits_before = metric_value(text, HITS)
    repeats = [post(server, "/predict", 1000) for _ in range(N_REPEATS)]
    prompt_tokens = repeats[0].json()["tokens"]["medtpe"]
    hits = metric_value(httpx.get(server.url + "/metrics", headers=HEADERS).text, HITS)
    full_blocks = (prompt_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert full_blocks > 0, prompt_tokens
    assert hits - hits_before >= (N_REPEATS - 1) * full_blocks, (hits - hits_before, prompt_tokens)


def counters(client: httpx.Client) -> tuple[float, float]:
    """vLLM's cumulative (prefix-cache queries, hits) in tokens, from the service's /metrics."""
    text = client.get("/metrics", headers=HEADERS).text
    return metric_value(text, QUERIES), metric_value(text, HITS)


def predict(client: httpx.Client, key: str, events: list[dict], when: datetime) -> dict:
    """One /predict as `key`; returns the response plus vLLM's counter deltas it caused."""
    before = counters(client)
    response = client.post(
        "/predict",
        json={"task": TASK, "events": events, "prediction_time": when.isoformat()},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 10  # the engine's stats arrive with its step outputs
    while (after := counters(client))[0] == before[0] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert after[0] > before[0], "vLLM's prefix-cache counters are not on /metrics"
    return {
        **response.json(),
        "queries": after[0] - before[0],
        "hits": after[1] - before[1],
    }


def record_tokens(client: httpx.Client, events: list[dict], when: datetime) -> int:
    """The MedTPE ids of the prompt's head and record at `when` (`/tokenize`'s shared part)."""
    body = {"tasks": [TASK], "events": events, "prediction_time": when.isoformat()}
    response = client.post("/tokenize", json=body, headers=HEADERS)
    assert response.status_code == 200, response.text
    return response.json()["shared"]["medtpe"]["count"]


def test_vllm_metrics_are_exposed(server: ServiceProcess) -> None:
    text = httpx.get(server.url + "/metrics", headers=HEADERS, timeout=30).text
    for family in (QUERIES, HITS, "vllm:time_to_first_token_seconds_bucket"):
        assert family in text
    assert "vllm:kv_cache_usage_perc" in text and "medtpe_engine_ready" in text


def test_growing_record_rescored_hourly_hits_the_prefix_cache(
    server: ServiceProcess, service_files: tuple[Path, Path]
) -> None:
    events = synthetic_events(31, n_events=400)
    last = datetime.fromisoformat(events[-1]["time"])
    times = [last - timedelta(hours=h) for h in range(6, -1, -1)]
    with httpx.Client(base_url=server.url, timeout=300) as client:
        results = [predict(client, KEYS[0], events, when) for when in times]
        shared = [record_tokens(client, events, when) for when in times]
    assert all(r["tokens"]["original"] <= 1024 for r in results)
    # the window's start moves about once per 6 hours: most re-scores reuse all of the previous
    # prompt's head and record but its end: its plain tail (the artefact's last ids stay unmerged
    # and merge once more text follows, `tests.support.prefix_stability`), a few ids before it,
    # and the last partly filled block (vLLM caches whole blocks, `BLOCK_TOKENS`); the task's
    # text after the record changes with the prediction time; the one re-score after the
    # start's jump hits nothing
    tail = MedTPETokenizer.load(service_files[0]).plain_tail
    stable = [n - tail - 16 for n in shared]  # 16: the merges' reach
    reusable = [n // BLOCK_TOKENS * BLOCK_TOKENS for n in stable]
    kept = [after["hits"] >= n > 0 for n, after in zip(reusable, results[1:], strict=False)]
    assert sum(kept) >= 4, [(r["hits"], r["queries"], r["tokens"]["medtpe"]) for r in results]


def test_api_keys_do_not_share_cached_prefixes(server: ServiceProcess) -> None:
    events = synthetic_events(47, n_events=80)
    when = datetime.fromisoformat(events[-1]["time"]) + timedelta(minutes=1)
    with httpx.Client(base_url=server.url, timeout=300) as client:
        first_a = predict(client, KEYS[0], events, when)
        again_a = predict(client, KEYS[0], events, when)
        first_b = predict(client, KEYS[1], events, when)  # tenant B's first request ever
        again_b = predict(client, KEYS[1], events, when)
    # without salts B would hit A's whole prompt; with them, nothing of it
    assert first_b["hits"] == 0, first_b
    # each key hits its own: every whole block of the prompt (not the last, partly filled one)
    for first, again in ((first_a, again_a), (first_b, again_b)):
        full_blocks = (again["queries"] - 1) // BLOCK_TOKENS * BLOCK_TOKENS
        assert again["hits"] >= full_blocks > 0 and again["hits"] > first["hits"], again


def test_sigterm_drains_a_request_in_flight(server: ServiceProcess) -> None:
    """Runs last: it stops the module's service. A request in flight at SIGTERM (a record
    filling the budget) is answered, then every process exits."""
    result: dict[str, httpx.Response] = {}
    slow = threading.Thread(
        target=lambda: result.setdefault("r", post(server, "/predict", 99, 400))
    )
    slow.start()
    for _ in range(3000):
        if metric_value(
            httpx.get(server.url + "/metrics", headers=HEADERS).text, "medtpe_inflight_requests"
        ):
            break
        threading.Event().wait(0.01)
    children = psutil.Process(server.process.pid).children(recursive=True)
    exit_code = server.stop()
    slow.join()
    assert result["r"].status_code == 200, result["r"].text
    assert exit_code in (0, -signal.SIGTERM), server.log()[-4000:]
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [p.pid for p in alive]
