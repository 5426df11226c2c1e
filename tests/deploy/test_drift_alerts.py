"""The drift alerts (deploy/prometheus-rules.yml, group `medtpe-drift`) fire on records whose
codes the artefact never saw, in promtool's rule engine, on the numbers the service exports.

The service runs in-process on the instant engine at an 8k-token input budget; it answers records
of known codes, then records of a site's local codes the artefact never saw; /metrics is scraped
after each. The counters' increase per batch becomes a day of known traffic followed by two hours
of unseen codes on site `api`, beside a CDS service's site that stays on known codes; promtool
evaluates the real rules on those series: at 25 hours the drift alerts fire for `api` only, and
nothing fires during the known day; the dashboard's drift panels read each site's shares from the
same series. deploy/prometheus-rules.test.yml keeps the same series, which must stay equal to
what the service exports now."""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.testclient import TestClient

from medtpe.core.cds.services import get_service
from medtpe.service.plumbing.metrics import API_SITE
from tests.support.deploy_support import DEPLOY, require_tool, substitute_grafana_macros
from tests.support.service_support import (
    AUTH,
    instant_client,
    instant_settings,
    metric_value,
    synthetic_events,
)
from tests.support.unseen_codes import (
    BUILD_GAUGE,
    DRIFT_COUNTERS,
    drift_metrics,
    unseen_events,
)

TASK = "icu_mortality"
HOOK_SITE = get_service("medtpe-icu-mortality-patient-view").id
RECORDS_PER_MINUTE = 3
KNOWN_MINUTES = 1440
UNSEEN_MINUTES = 120
DRIFT_ALERTS = (
    "MedTPECompressionBelowBuild",
    "MedTPEUndescribedCodesRising",
    "MedTPEBudgetDropsRising",
)


@pytest.fixture(scope="module")
def client(service_files: tuple[Path, Path]) -> Iterator[TestClient]:
    settings = instant_settings(service_files, max_input_tokens=8192, allow_unvalidated_budget=True)
    with instant_client(settings) as client:
        yield client


def scrape(client: TestClient) -> str:
    return client.get("/metrics", headers=AUTH).text


def per_minute(client: TestClient, records: list[list[dict]]) -> dict[str, int]:
    """The counters' increase over the answers to `records` (a minute's traffic)."""
    before = drift_metrics(scrape(client), TASK, API_SITE)
    for events in records:
        response = client.post("/predict", json={"task": TASK, "events": events}, headers=AUTH)
        assert response.status_code == 200, response.text
    after = drift_metrics(scrape(client), TASK, API_SITE)
    return {name: int(after[name] - before[name]) for name in DRIFT_COUNTERS}


@pytest.fixture(scope="module")
def exported(client: TestClient) -> dict[str, Any]:
    """Increase per minute of known and of unseen traffic, and the build figure."""
    known = [synthetic_events(100 + i, 400) for i in range(RECORDS_PER_MINUTE)]
    unseen = [unseen_events(200 + i, 400, seed=i) for i in range(RECORDS_PER_MINUTE)]
    return {
        "known": per_minute(client, known),
        "unseen": per_minute(client, unseen),
        "build": metric_value(scrape(client), BUILD_GAUGE),
    }


def selector(name: str, site: str) -> str:
    metric, extra = DRIFT_COUNTERS[name]
    labels = {"task": TASK, "site": site, **extra}
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{metric}{{{inner}}}"


def drift_series(exported: dict[str, Any]) -> list[dict[str, str]]:
    """promtool input series: `api` a day of known traffic then unseen codes, the CDS service's
    site known traffic throughout, the build's gauge."""
    total = KNOWN_MINUTES + UNSEEN_MINUTES
    series = []
    for name in DRIFT_COUNTERS:
        a, b = exported["known"][name], exported["unseen"][name]
        switched = f"0+{a}x{KNOWN_MINUTES} {KNOWN_MINUTES * a + b}+{b}x{UNSEEN_MINUTES - 1}"
        series.append({"series": selector(name, API_SITE), "values": switched})
        series.append({"series": selector(name, HOOK_SITE), "values": f"0+{a}x{total}"})
    series.append({"series": BUILD_GAUGE, "values": f"{exported['build']}x{total}"})
    return series


def expected_alerts(site: str) -> list[dict[str, Any]]:
    """The drift alerts for `site`, with their annotations rendered as the rules write them."""
    groups = yaml.safe_load((DEPLOY / "prometheus-rules.yml").read_text())["groups"]
    rules = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    return [
        {
            "alertname": name,
            "exp_labels": {
                "severity": rules[name]["labels"]["severity"],
                "task": TASK,
                "site": site,
            },
            "exp_annotations": {
                key: text.replace("{{ $labels.task }}", TASK).replace("{{ $labels.site }}", site)
                for key, text in rules[name]["annotations"].items()
            },
        }
        for name in DRIFT_ALERTS
    ]


def rule_test(exported: dict[str, Any]) -> dict[str, Any]:
    """The promtool test of the drift rules on the exported series."""
    fired = {a["alertname"]: a for a in expected_alerts(API_SITE)}
    checks = []
    for name in DRIFT_ALERTS:
        checks.append({"eval_time": f"{KNOWN_MINUTES - 40}m", "alertname": name, "exp_alerts": []})
        alert = {k: v for k, v in fired[name].items() if k != "alertname"}
        checks.append(
            {"eval_time": f"{KNOWN_MINUTES + 90}m", "alertname": name, "exp_alerts": [alert]}
        )
    return {"interval": "1m", "input_series": drift_series(exported), "alert_rule_test": checks}


def promtool_test(document: dict[str, Any], path: Path) -> None:
    """Write the promtool rule test `document` to `path` and pass it in `promtool test rules`."""
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_exported_figures_tell_unseen_codes_apart(exported: dict[str, Any]) -> None:
    known, unseen = exported["known"], exported["unseen"]
    build = exported["build"]
    assert 0 < build < 1

    def compression(m: dict[str, int]) -> float:
        return 1 - m["medtpe"] / m["original"]

    assert compression(unseen) < build - 0.05 < build < compression(known) + 0.05
    assert (
        unseen["medtpe_drift_events_undescribed_total"]
        > 100 * known["medtpe_drift_events_undescribed_total"]
    )


def test_the_drift_alerts_fire_on_unseen_codes_in_promtool(
    exported: dict[str, Any], tmp_path: Path
) -> None:
    document = {
        "rule_files": [str(DEPLOY / "prometheus-rules.yml")],
        "evaluation_interval": "1m",
        "tests": [rule_test(exported)],
    }
    promtool_test(document, tmp_path / "drift.test.yml")


def test_the_committed_rule_test_holds_the_exported_series(exported: dict[str, Any]) -> None:
    """deploy/prometheus-rules.test.yml's drift test is this one: same series, same checks."""
    committed = yaml.safe_load((DEPLOY / "prometheus-rules.test.yml").read_text())["tests"]
    generated = rule_test(exported)
    assert generated in committed, (
        "replace the drift test of deploy/prometheus-rules.test.yml "
        "with:\n" + yaml.safe_dump([generated], sort_keys=False)
    )


def test_every_alert_has_a_runbook_section() -> None:
    """Each drift alert's `runbook_url` names a section of docs/runbook.md that names it."""
    groups = yaml.safe_load((DEPLOY / "prometheus-rules.yml").read_text())["groups"]
    (drift,) = [g for g in groups if g["name"] == "medtpe-drift"]
    assert {r["alert"] for r in drift["rules"]} == set(DRIFT_ALERTS)
    runbook = (DEPLOY.parent / "docs" / "runbook.md").read_text()
    headings = {line[4:].strip() for line in runbook.splitlines() if line.startswith("### ")}
    for rule in drift["rules"]:
        path, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert path == "docs/runbook.md" and anchor == rule["alert"].lower(), rule["alert"]
        assert rule["alert"] in headings


ROUNDING = 1e-6


def rounded(value: float) -> float:
    """`value` as PromQL's `round(value, ROUNDING)` gives it."""
    inverse = 1 / ROUNDING
    return math.floor(value * inverse + 0.5) / inverse


def test_the_dashboard_drift_panels_read_the_shares_of_the_exported_series(
    exported: dict[str, Any], tmp_path: Path
) -> None:
    """Each drift panel's query, evaluated by promtool on the exported series two hours after
    the switch, gives the share of the unseen records' figures for `api` and of the known
    records' for the CDS service's site."""
    board = json.loads((DEPLOY / "grafana" / "dashboards" / "medtpe.json").read_text())
    panels = [p for p in board["panels"] if p["title"].startswith("Drift:")]

    def shares(m: dict[str, int]) -> list[float]:
        shown = m["medtpe_drift_events_total"] - m["medtpe_drift_events_dropped_total"]
        return [
            1 - m["medtpe"] / m["original"],
            m["medtpe_drift_events_undescribed_total"] / shown,
            m["medtpe_drift_events_dropped_total"] / m["medtpe_drift_events_total"],
            m["medtpe_drift_merged_tokens_total"] / m["medtpe"],
        ]

    expected = {API_SITE: shares(exported["unseen"]), HOOK_SITE: shares(exported["known"])}
    assert len(panels) == 4
    checks = []
    for i, panel in enumerate(panels):
        # rounded as PromQL's round() does: promtool compares sample values exactly
        expr = f"round({substitute_grafana_macros(panel['targets'][0]['expr'])}, {ROUNDING})"
        samples = [
            {"labels": f'{{site="{site}", task="{TASK}"}}', "value": rounded(values[i])}
            for site, values in expected.items()
        ]
        checks.append(
            {
                "expr": expr,
                "eval_time": f"{KNOWN_MINUTES + UNSEEN_MINUTES - 1}m",
                "exp_samples": samples,
            }
        )
    build = panels[0]["targets"][1]["expr"]
    checks.append(
        {
            "expr": build,
            "eval_time": "10m",
            "exp_samples": [{"labels": "{}", "value": exported["build"]}],
        }
    )
    test = {"interval": "1m", "input_series": drift_series(exported), "promql_expr_test": checks}
    promtool_test({"tests": [test]}, tmp_path / "panels.test.yml")
