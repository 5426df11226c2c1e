"""The service's stop (`medtpe.service.drain`), served by uvicorn in a thread on an engine that
holds each generation: a request that outlives the grace period is answered 503 `shutting_down` in
the JSON error body with `Retry-After`, never uvicorn's bare 500; during the drain new requests
are refused the same way and readiness is red; one that ends within the grace is answered; both
kinds of 503 are counted in `/metrics`. (On the real engine and `medtpe serve`:
test_service_shutdown.py.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from medtpe.service.plumbing.state import SHUTDOWN_RETRY_AFTER_S
from tests.support.service_support import (
    InThread,
    instant_settings,
    metric_value,
    serving_in_thread,
    synthetic_events,
)

pytestmark = [pytest.mark.timeout(900)]

BODY = {"task": "icu_mortality", "events": synthetic_events(7, 20)}


def predict_in_thread(url: str) -> tuple[threading.Thread, dict[str, httpx.Response]]:
    """A `/predict` on its own thread; its response lands in the dict under "r"."""
    result: dict[str, httpx.Response] = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("r", httpx.post(url + "/predict", json=BODY, timeout=120))
    )
    thread.start()
    return thread, result


def stop_with_one_in_flight(served: InThread, release: bool) -> dict[str, httpx.Response]:
    """Start a request, begin the stop once it is in flight, send one more while draining and
    read `/readyz` and `/metrics` then, and `release` the engine's hold on the first if asked;
    returns those responses and the first one's."""
    state = served.server.state
    thread, result = predict_in_thread(served.url)
    deadline = time.monotonic() + 30
    while not state.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state.in_flight == 1
    served.server.should_exit = True
    while not state.draining and time.monotonic() < deadline:
        time.sleep(0.01)
    during = {
        "late": httpx.post(served.url + "/predict", json=BODY),
        "tokenize": httpx.post(served.url + "/tokenize", json={"text": "Heart Rate"}),
        "readyz": httpx.get(served.url + "/readyz"),
        "metrics": httpx.get(served.url + "/metrics"),
    }
    if release:
        state.engine.release()
    thread.join()
    return {
        **during,
        "in_flight": result["r"],
        "after": httpx.Response(200, text=state_text(served)),
    }


def state_text(served: InThread) -> str:
    """The app's `/metrics` text, read from its state once the server stopped listening."""
    return served.server.state.metrics.render().decode()


def assert_shutting_down(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"] == "shutting_down"
    assert response.headers["retry-after"] == str(SHUTDOWN_RETRY_AFTER_S)


@pytest.mark.parametrize("outlives_grace", [True, False], ids=["cut", "drained"])
def test_a_stop_answers_every_request(
    service_files: tuple[Path, Path], outlives_grace: bool
) -> None:
    # the cut: a grace long enough for the four requests the test sends during the drain (each
    # refused or read at once), on a busy machine too; drained: the engine holds the request
    # until they are answered
    grace, hold = (3.0, 600.0) if outlives_grace else (120.0, 600.0)
    settings = instant_settings(service_files, api_keys=[], shutdown_grace_s=grace)
    with serving_in_thread(settings, delay_s=hold) as served:
        started = time.monotonic()
        seen = stop_with_one_in_flight(served, release=not outlives_grace)
        waited = time.monotonic() - started

    assert_shutting_down(seen["late"])
    assert_shutting_down(seen["tokenize"])
    assert seen["readyz"].status_code == 503 and seen["readyz"].json()["status"] == "stopping"
    refused = 'medtpe_rejections_total{reason="shutting_down"}'
    assert refused in seen["metrics"].text, seen["metrics"].text
    after = seen["after"].text
    assert metric_value(after, "medtpe_rejections_total", reason="shutting_down") == 2
    cut = metric_value(after, "medtpe_errors_total", reason="shutting_down")
    if outlives_grace:
        assert_shutting_down(seen["in_flight"])
        assert cut == 1 and waited < hold / 2  # answered at the grace's end, not the engine's
    else:
        assert seen["in_flight"].status_code == 200, seen["in_flight"].text
        assert cut == 0
    assert metric_value(after, "medtpe_inflight_requests") == 0
