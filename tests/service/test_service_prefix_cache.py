"""The real engine's prefix cache through the service, read from vLLM's own counters on /metrics:
a growing record re-scored hourly under the stable window hits it, and API keys never share it
(each key's generations carry their own cache salt)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.support.service_support import (
    ServiceProcess,
    metric_value,
    running_service,
    service_env,
    synthetic_events,
)

pytestmark = [pytest.mark.slow, pytest.mark.engine]

KEYS = ("tenant-a-key", "tenant-b-key")
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
TASK = "icu_mortality"


@pytest.fixture(scope="module")
def server(
    service_files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """A service with two API keys and the stable window (budget 1,024 tokens)."""
    env = service_env(
        service_files,
        MEDTPE_API_KEYS=",".join(KEYS),
        MEDTPE_WINDOW_POLICY="stable",
        MEDTPE_WINDOW_GRID_HOURS="6",
    )
    with running_service(env, tmp_path_factory.mktemp("prefix-cache") / "service.log") as process:
        yield process


def counters(client: httpx.Client) -> tuple[float, float]:
    """vLLM's cumulative (prefix-cache queries, hits) in tokens, from the service's /metrics."""
    text = client.get("/metrics").text
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


def test_vllm_metrics_are_exposed(server: ServiceProcess) -> None:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    for family in (QUERIES, HITS, "vllm:time_to_first_token_seconds_bucket"):
        assert family in text
    assert "vllm:kv_cache_usage_perc" in text and "medtpe_engine_ready 1.0" in text


def test_growing_record_rescored_hourly_hits_the_prefix_cache(server: ServiceProcess) -> None:
    events = synthetic_events(31, n_events=400)
    last = datetime.fromisoformat(events[-1]["time"])
    times = [last - timedelta(hours=h) for h in range(6, -1, -1)]
    with httpx.Client(base_url=server.url, timeout=300) as client:
        results = [predict(client, KEYS[0], events, when) for when in times]
    assert all(r["tokens"]["original"] <= 1024 for r in results)
    rescores = results[1:]
    hit_rate = sum(r["hits"] for r in rescores) / sum(r["queries"] for r in rescores)
    # the window's start moves about once per 6 hours: most re-scores reuse all but the tail.
    # vLLM caches whole blocks (128 tokens on the CPU backend) of these ~500-token prompts, so
    # a re-score sharing 80 % of its previous prompt's tokens hits 55-75 % of them; the one
    # re-score after the start's jump hits nothing
    assert hit_rate > 0.5, [(r["hits"], r["queries"]) for r in results]
    assert sum(r["hits"] >= 0.5 * r["queries"] for r in rescores) >= 4, rescores


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
    # each key hits its own: all but the last, partly filled block of the prompt
    for first, again in ((first_a, again_a), (first_b, again_b)):
        assert again["hits"] > 0.8 * again["queries"] and again["hits"] > first["hits"]
