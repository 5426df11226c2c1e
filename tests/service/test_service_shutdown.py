"""The stop of `medtpe serve` on the real engine, with a grace period (the session service's,
`SHUTDOWN_GRACE_S`) shorter than the request in flight: during the drain readiness is red and a
new request is refused with 503 `shutting_down` (counted in `/metrics`); when the grace ends the
request still generating is answered 503 `shutting_down` in the JSON error body with
`Retry-After` by the service itself, not a bare 500; then the process exits cleanly. Runs last
among the service tests: it stops the session's service. (A request that ends within the grace
is answered: test_service_api_workers.py; both paths in-process: test_service_drain.py.)"""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from medtpe.service.plumbing.state import SHUTDOWN_RETRY_AFTER_S
from tests.support.service_support import (
    SERVICE_API_KEY,
    SHUTDOWN_GRACE_S,
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

HEADERS = {"X-API-Key": SERVICE_API_KEY}
LONG_BATCH = {
    "records": [
        {
            "task": "icu_mortality",
            "events": synthetic_events(500 + i, 100),
            "options": {"n_samples": 9, "temperature": 1.0},
        }
        for i in range(16)
    ]
}
"""16 distinct records filling the service's 1,024-token budget, 9 samples each: minutes of
generation on 2 CPU cores, far beyond the grace period (about 150 KB: within the session
service's 256 KiB body limit)."""


def assert_shutting_down(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"] == "shutting_down"
    assert response.headers["retry-after"] == str(SHUTDOWN_RETRY_AFTER_S)


def test_a_stop_answers_requests_beyond_the_grace_503(service_server: ServiceProcess) -> None:
    url = service_server.url
    result: dict[str, httpx.Response] = {}

    def call() -> None:
        result["batch"] = httpx.post(
            url + "/predict/batch", json=LONG_BATCH, headers=HEADERS, timeout=600
        )

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 60
    while (
        metric_value(httpx.get(url + "/metrics", headers=HEADERS).text, "medtpe_inflight_requests")
        < 1
    ):
        assert "batch" not in result, result["batch"].text
        assert time.monotonic() < deadline, "the batch never went in flight"
        time.sleep(0.02)
    stopped_at = time.monotonic()
    service_server.process.send_signal(signal.SIGTERM)
    while httpx.get(url + "/readyz").json()["status"] != "stopping":
        assert time.monotonic() < stopped_at + SHUTDOWN_GRACE_S, "no drain began"
        time.sleep(0.02)
    late = httpx.post(url + "/predict", json=LONG_BATCH["records"][0], headers=HEADERS, timeout=60)
    refused = metric_value(
        httpx.get(url + "/metrics", headers=HEADERS).text,
        "medtpe_rejections_total",
        reason="shutting_down",
    )
    thread.join()
    answered_after = time.monotonic() - stopped_at
    exit_code = service_server.stop()

    assert_shutting_down(late)
    assert refused == 1
    assert_shutting_down(result["batch"])
    assert answered_after < SHUTDOWN_GRACE_S + 30  # at the grace's end, not the batch's
    # uvicorn re-raises the signal once shut down: "killed by SIGTERM" is its clean exit
    assert exit_code in (0, -signal.SIGTERM)
    log = service_server.log()
    assert "grace period over: 1 request(s) answered 503 shutting_down" in log
    assert "Application shutdown complete." in log
    assert "Traceback" not in log[log.index("draining") :]
