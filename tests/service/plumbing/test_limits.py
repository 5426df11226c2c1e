"""Load limits and failure paths, in-process on an engine that holds each generation for 2 s:
one generation slot, one queue place and a 1 s deadline. Then the engine reports death:
readiness, liveness and the readiness gauge must turn red. (The real engine's death detection is
tested in test_vllm_engine.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from tests.support.service_support import (
    instant_client,
    instant_settings,
    metric_value,
    synthetic_events,
)

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def limited(service_files: tuple[Path, Path]) -> Iterator[TestClient]:
    settings = instant_settings(
        service_files, api_keys=[], max_concurrency=1, queue_limit=1, request_timeout_s=1.0
    )
    with instant_client(settings, delay_s=2.0) as client:
        yield client


def short_record(subject_id: int) -> dict:
    return {"task": "icu_mortality", "events": synthetic_events(subject_id, 20)}


def inflight(client: TestClient) -> float:
    return metric_value(client.get("/metrics").text, "medtpe_inflight_requests")


def test_generation_timeout(limited: TestClient) -> None:
    response = limited.post("/predict", json=short_record(1))
    assert response.status_code == 504
    assert response.json()["error"] == "timeout"
    text = limited.get("/metrics").text
    assert metric_value(text, "medtpe_errors_total", reason="timeout") >= 1


def test_queue_full_is_503_with_retry_after(limited: TestClient) -> None:
    batch: dict[str, httpx.Response] = {}

    def fill() -> None:  # two records: one generating, one queued = full capacity
        batch["response"] = limited.post(
            "/predict/batch", json={"records": [short_record(2), short_record(3)]}
        )

    thread = threading.Thread(target=fill)
    thread.start()
    deadline = time.monotonic() + 30
    while inflight(limited) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    response = limited.post("/predict", json=short_record(4))
    thread.join()
    assert response.status_code == 503
    assert response.json()["error"] == "queue_full"
    assert int(response.headers["retry-after"]) >= 1
    assert batch["response"].status_code == 504  # the batch itself outlived its deadline
    text = limited.get("/metrics").text
    assert metric_value(text, "medtpe_rejections_total", reason="queue_full") >= 1


def test_batch_larger_than_capacity_is_invalid(limited: TestClient) -> None:
    records = [short_record(i) for i in range(3)]
    response = limited.post("/predict/batch", json={"records": records})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "records"]


def test_dead_engine_turns_readiness_red(limited: TestClient) -> None:
    assert limited.get("/readyz").status_code == 200
    assert metric_value(limited.get("/metrics").text, "medtpe_engine_ready") == 1
    limited.app.state.service.engine.die()
    ready = limited.get("/readyz")
    assert ready.status_code == 503 and ready.json()["status"] == "engine_dead"
    response = limited.post("/predict", json=short_record(5))
    assert response.status_code == 503
    assert response.json()["error"] == "engine_dead"
    assert metric_value(limited.get("/metrics").text, "medtpe_engine_ready") == 0
    # liveness turns red too, so an orchestrator restarts the instance
    health = limited.get("/healthz")
    assert health.status_code == 503 and health.json() == {"status": "engine_dead"}
