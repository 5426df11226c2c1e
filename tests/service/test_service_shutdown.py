"""Graceful shutdown: SIGTERM while a request is generating lets it finish, then the process
exits cleanly. Runs last among the service tests: it stops the session's service."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from tests.support.service_support import (
    SERVICE_API_KEY,
    ServiceProcess,
    metric_value,
    synthetic_events,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.engine,
    pytest.mark.stops_service,
    pytest.mark.timeout(900),
]


def test_sigterm_drains_inflight_requests(service_server: ServiceProcess) -> None:
    headers = {"X-API-Key": SERVICE_API_KEY}
    body = {
        "task": "icu_mortality",
        "events": synthetic_events(42, 300),
        "options": {"n_samples": 3, "temperature": 1.0},
    }
    result: dict[str, httpx.Response] = {}

    def call() -> None:
        result["response"] = httpx.post(
            service_server.url + "/predict", json=body, headers=headers, timeout=300
        )

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = httpx.get(service_server.url + "/metrics").text
        if metric_value(text, "medtpe_inflight_requests") >= 1:
            break
        time.sleep(0.02)
    exit_code = service_server.stop()
    thread.join()
    assert result["response"].status_code == 200, result["response"].text
    assert result["response"].json()["tokens"]["original"] > 0
    # uvicorn re-raises the signal once shut down: "killed by SIGTERM" is its clean exit
    assert exit_code in (0, -signal.SIGTERM)
    log = service_server.log()
    assert log.index("Shutting down") < log.rindex('POST /predict HTTP/1.1" 200')
    assert "Application shutdown complete." in log
