"""A real Prometheus (Debian's `prometheus` binary) scrapes the running service.

Prometheus runs on loopback with a random free port and its own data directory; its
configuration is deploy/prometheus.yml with the scrape target pointed at the service, its
bearer token (the credentials file) one the service accepts at /metrics, a 1 s scrape interval,
and the real alert rules. First against the service on the instant engine: it scrapes with the
token, and a job without it is refused. Then against the service the service tests start with
the real vLLM engine (the session fixture `service_server` of tests/conftest.py): the test sends
/predict requests and reads the latency histogram back through Prometheus' HTTP API, then runs
the Grafana dashboard's queries against it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from tests.support.deploy_support import DEPLOY, require_tool, substitute_grafana_macros
from tests.support.polling import wait_for
from tests.support.service_support import (
    SERVICE_API_KEY,
    ServiceProcess,
    instant_settings,
    served_in_thread,
    synthetic_events,
)

SCRAPE_INTERVAL_S = 1
PROMETHEUS_START_TIMEOUT_S = 60
# a scrape, ingestion and a query: a few scrape intervals; generous for a loaded 2-core machine
SCRAPE_WAIT_S = 60
TASK = "icu_mortality"
AUTH = {"Authorization": f"Bearer {SERVICE_API_KEY}"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Prometheus:
    url: str
    client: httpx.Client
    log: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the result vector (fails on a query error)."""
        response = self.client.get(f"{self.url}/api/v1/query", params={"query": expr})
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def value(self, expr: str, labels: dict[str, str]) -> float | None:
        """The value of the series of `expr` that carries `labels`, if there is one."""
        for series in self.query(expr):
            if labels.items() <= series["metric"].items():
                return float(series["value"][1])
        return None


def prometheus_config(
    service_url: str, data: Path, token: str, without_token: bool = False
) -> Path:
    """deploy/prometheus.yml, pointed at the service, scraping every second with `token` in
    its credentials file; `without_token`: a second job, `medtpe_no_token`, sends none."""
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"].update(
        scrape_interval=f"{SCRAPE_INTERVAL_S}s", evaluation_interval=f"{SCRAPE_INTERVAL_S}s"
    )
    config["rule_files"] = [str(DEPLOY / name) for name in config["rule_files"]]
    (job,) = config["scrape_configs"]
    job["scrape_timeout"] = f"{SCRAPE_INTERVAL_S}s"
    job["static_configs"] = [{"targets": [urlsplit(service_url).netloc]}]
    assert job["authorization"]["type"] == "Bearer"
    credentials = data / "metrics-token"
    credentials.write_text(token + "\n")
    job["authorization"]["credentials_file"] = str(credentials)
    if without_token:
        bare = copy.deepcopy(job)
        del bare["authorization"]
        config["scrape_configs"].append(bare | {"job_name": "medtpe_no_token"})
    path = data / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def running_prometheus(config: Path, data: Path) -> Iterator[Prometheus]:
    """Prometheus with `config`, its data under `data`, on a free loopback port, until ready."""
    port = free_port()
    log = data / "prometheus.log"
    with log.open("w") as log_file:
        process = subprocess.Popen(
            [
                require_tool("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={data / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=10) as client:

            def ready() -> bool:
                if process.poll() is not None:
                    pytest.fail(f"prometheus exited with {process.returncode}:\n{log.read_text()}")
                return client.get(f"{url}/-/ready").status_code == 200

            wait_for("Prometheus to be ready", ready, PROMETHEUS_START_TIMEOUT_S, log)
            yield Prometheus(url, client, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_prometheus_scrapes_with_the_token_and_nothing_else_is_let_in(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """The service on the instant engine, with API keys and a metrics token: Prometheus' job
    with deploy/prometheus.yml's credentials file is up; the same job without it is down
    (401); the token opens /metrics only."""
    token = "scrape-token-of-the-test"
    settings = instant_settings(service_files, metrics_keys=[token])
    with served_in_thread(settings) as url:
        assert httpx.get(url + "/metrics").status_code == 401
        assert (
            httpx.post(url + "/tokenize", json={"text": "a"}, headers=bearer(token)).status_code
            == 401
        )
        config = prometheus_config(url, tmp_path, token, without_token=True)
        with running_prometheus(config, tmp_path) as prometheus:
            wait_for(
                "both jobs to be scraped",
                lambda: len(prometheus.query("up")) == 2,
                SCRAPE_WAIT_S,
                prometheus.log,
            )
            assert prometheus.value("up", {"job": "medtpe"}) == 1
            assert prometheus.value("up", {"job": "medtpe_no_token"}) == 0
            assert prometheus.value("medtpe_engine_ready", {"job": "medtpe"}) == 1


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def prometheus(
    service_server: ServiceProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    """Prometheus scraping `service_server` with one of its API keys as the token."""
    host = urlsplit(service_server.url).hostname
    assert host in {"127.0.0.1", "localhost"}, "the service under test listens on loopback"
    data = tmp_path_factory.mktemp("prometheus")
    with running_prometheus(
        prometheus_config(service_server.url, data, SERVICE_API_KEY), data
    ) as p:
        yield p


@pytest.fixture(scope="module")
def predicted(prometheus: Prometheus, service_server: ServiceProcess) -> dict[str, str]:
    """Two /predict requests, each seen by a scrape; the labels of their latency series.

    Two, so that rate() over the histogram sees an increase even when the first request is the
    one that creates the series."""
    labels = {"job": "medtpe", "endpoint": "predict", "task": TASK}
    count = "medtpe_request_latency_seconds_count"
    with httpx.Client(base_url=service_server.url, headers=AUTH, timeout=300) as service:
        wait_for(
            "Prometheus to scrape the service",
            lambda: prometheus.value('up{job="medtpe"}', {}) == 1,
            SCRAPE_WAIT_S,
            prometheus.log,
        )
        for subject_id in (7001, 7002):
            seen = prometheus.value(count, labels) or 0.0
            body = {"task": TASK, "events": synthetic_events(subject_id, 30)}
            response = service.post("/predict", json=body)
            assert response.status_code == 200, response.text
            wait_for(
                f"{count} above {seen}",
                lambda seen=seen: (prometheus.value(count, labels) or 0.0) > seen,
                SCRAPE_WAIT_S,
                prometheus.log,
            )
    return labels


@pytest.mark.slow
@pytest.mark.engine
def test_probe_paths_answer(service_server: ServiceProcess) -> None:
    """The paths of the container health check and the Kubernetes probes."""
    with httpx.Client(base_url=service_server.url, timeout=30) as service:
        assert service.get("/healthz").status_code == 200
        assert service.get("/readyz").status_code == 200


@pytest.mark.slow
@pytest.mark.engine
def test_prometheus_reads_back_the_latency_histogram(
    prometheus: Prometheus, predicted: dict[str, str]
) -> None:
    total = prometheus.value("medtpe_request_latency_seconds_count", predicted)
    assert total is not None and total >= 2
    inf_bucket = prometheus.value(
        "medtpe_request_latency_seconds_bucket", {**predicted, "le": "+Inf"}
    )
    assert inf_bucket == total
    latency_sum = prometheus.value("medtpe_request_latency_seconds_sum", predicted)
    assert latency_sum is not None and latency_sum > 0
    p50 = prometheus.value(
        "histogram_quantile(0.5, sum by (task, le) "
        '(rate(medtpe_request_latency_seconds_bucket{endpoint="predict"}[1m])))',
        {"task": predicted["task"]},
    )
    assert p50 is not None and math.isfinite(p50) and p50 > 0


@pytest.mark.slow
@pytest.mark.engine
def test_dashboard_queries_answer_from_the_real_metrics(
    prometheus: Prometheus, predicted: dict[str, str]
) -> None:
    """Every Grafana query runs; those about served predictions return data (label values
    such as endpoint="predict" and tokenizer="medtpe" match what the service exports)."""
    board = json.loads((DEPLOY / "grafana" / "dashboards" / "medtpe.json").read_text())
    failures_only = ("medtpe_errors_total", "medtpe_rejections_total")
    for panel in board["panels"]:
        for target in panel["targets"]:
            result = prometheus.query(substitute_grafana_macros(target["expr"]))
            if any(name in target["expr"] for name in failures_only):
                continue  # no series until something fails: the query only has to run
            # a series of another task (or door) that other tests fed earlier has no requests in
            # the window: its quantiles are NaN, as the dashboard shows them; the predicted ones
            # must have values
            ours = [
                float(series["value"][1])
                for series in result
                if all(series["metric"].get(k, v) == v for k, v in predicted.items())
            ]
            assert ours and all(math.isfinite(v) for v in ours), (panel["title"], result)
            if "tokenizer" in target["legendFormat"]:
                tokenizers = {series["metric"]["tokenizer"] for series in result}
                assert tokenizers == {"original", "medtpe"}, panel["title"]
    tasks = prometheus.client.get(
        f"{prometheus.url}/api/v1/label/task/values",
        params={"match[]": "medtpe_request_latency_seconds_count"},
    ).json()["data"]
    assert predicted["task"] in tasks


@pytest.mark.slow
@pytest.mark.engine
def test_alert_rules_load_and_evaluate(prometheus: Prometheus, predicted: dict[str, str]) -> None:
    def evaluated() -> list[dict[str, Any]]:
        response = prometheus.client.get(f"{prometheus.url}/api/v1/rules")
        rules = [r for g in response.json()["data"]["groups"] for r in g["rules"]]
        done = all(not r["lastEvaluation"].startswith("0001-") for r in rules)
        return rules if rules and done else []

    rules = wait_for("the alert rules to be evaluated", evaluated, SCRAPE_WAIT_S, prometheus.log)
    names = {rule["name"] for rule in rules}
    expected = yaml.safe_load((DEPLOY / "prometheus-rules.yml").read_text())["groups"]
    assert names == {rule["alert"] for group in expected for rule in group["rules"]}
    for rule in rules:
        assert rule["health"] == "ok", rule
    # the service is up and ready: the availability alerts stay quiet
    firing = {r["name"] for r in rules if r["state"] != "inactive"}
    assert not firing & {"MedTPETargetDown", "MedTPEEngineNotReady"}
