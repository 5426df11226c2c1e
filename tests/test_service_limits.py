"""Load limits and failure paths on a second service instance with tiny limits: one generation
slot, one queue place, a 1 s deadline and a 4,096-token input budget (a full-budget prompt takes
several seconds to prefill on CPU, so it reliably outlives the deadline). Then its engine
process is killed: readiness must turn red."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from service_support import ServiceProcess, metric_value, service_env, synthetic_events

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def limited_server(
    service_files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    env = service_env(
        service_files,
        MEDTPE_MAX_CONCURRENCY="1",
        MEDTPE_QUEUE_LIMIT="1",
        MEDTPE_REQUEST_TIMEOUT_S="1",
        MEDTPE_MAX_INPUT_TOKENS="4096",
    )
    server = ServiceProcess(env, tmp_path_factory.mktemp("limited") / "service.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def long_record(subject_id: int) -> dict:
    """A record that fills the 4,096-token budget."""
    return {"task": "icu_mortality", "events": synthetic_events(subject_id, 600)}


def inflight(server: ServiceProcess) -> float:
    return metric_value(httpx.get(server.url + "/metrics").text, "medtpe_inflight_requests")


def test_generation_timeout(limited_server: ServiceProcess) -> None:
    response = httpx.post(limited_server.url + "/predict", json=long_record(1), timeout=60)
    assert response.status_code == 504
    assert response.json()["error"] == "timeout"
    text = httpx.get(limited_server.url + "/metrics").text
    assert metric_value(text, "medtpe_errors_total", reason="timeout") >= 1


def test_queue_full_is_503_with_retry_after(limited_server: ServiceProcess) -> None:
    batch: dict[str, httpx.Response] = {}

    def fill() -> None:  # two records: one generating, one queued = full capacity
        batch["response"] = httpx.post(
            limited_server.url + "/predict/batch",
            json={"records": [long_record(2), long_record(3)]},
            timeout=60,
        )

    thread = threading.Thread(target=fill)
    thread.start()
    deadline = time.monotonic() + 30
    while inflight(limited_server) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    response = httpx.post(limited_server.url + "/predict", json=long_record(4), timeout=60)
    thread.join()
    assert response.status_code == 503
    assert response.json()["error"] == "queue_full"
    assert int(response.headers["retry-after"]) >= 1
    assert batch["response"].status_code == 504  # the batch itself outlived its deadline
    text = httpx.get(limited_server.url + "/metrics").text
    assert metric_value(text, "medtpe_rejections_total", reason="queue_full") >= 1


def test_batch_larger_than_capacity_is_invalid(limited_server: ServiceProcess) -> None:
    records = [long_record(i) for i in range(3)]
    response = httpx.post(limited_server.url + "/predict/batch", json={"records": records})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "records"]


def test_dead_engine_turns_readiness_red(limited_server: ServiceProcess) -> None:
    assert httpx.get(limited_server.url + "/readyz").status_code == 200
    pids = limited_server.engine_core_pids()
    assert pids, "no engine process found"
    for pid in pids:
        psutil.Process(pid).kill()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready = httpx.get(limited_server.url + "/readyz")
        if ready.status_code == 503:
            break
        time.sleep(0.5)
    assert ready.status_code == 503 and ready.json()["status"] == "engine_dead"
    record = {"task": "icu_mortality", "events": synthetic_events(5, 5)}
    response = httpx.post(limited_server.url + "/predict", json=record, timeout=60)
    assert response.status_code == 503
    assert response.json()["error"] == "engine_dead"
    text = httpx.get(limited_server.url + "/metrics").text
    assert metric_value(text, "medtpe_engine_ready") == 0
    # liveness turns red too, so an orchestrator restarts the instance
    health = httpx.get(limited_server.url + "/healthz")
    assert health.status_code == 503 and health.json() == {"status": "engine_dead"}
