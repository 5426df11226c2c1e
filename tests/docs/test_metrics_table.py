"""The table of Prometheus metrics in docs/architecture.md is the service's metrics, both ways:
every metric the service registers is a row with its type and label names, and every row is a
registered metric. The registered side is read from a real `ServiceMetrics` (its metric objects
and the exposition `/metrics` serves), not from the source text."""

from __future__ import annotations

import re
from typing import NamedTuple

from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from medtpe.service.plumbing.metrics import ENGINE_METRIC_PREFIX, ServiceMetrics
from tests.support.paths import ROOT

TABLE_HEADING = "### Prometheus metric names"


class Row(NamedTuple):
    name: str
    kind: str
    labels: frozenset[str]


def documented() -> set[Row]:
    """The rows of the metrics table: the exposed name, its type and its label names (the
    backticked words of the labels column outside parentheses, which hold values and notes)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split(TABLE_HEADING, 1)[1].split("\n#", 1)[0]
    rows = set()
    for name, kind, labels in re.findall(r"^\| `(\w+)` \| (\w+) \| (.*) \|$", section, re.M):
        outside = re.sub(r"\([^()]*\)", "", labels)
        rows.add(Row(name, kind, frozenset(re.findall(r"`(\w+)`", outside))))
    return rows


def registered() -> set[Row]:
    """The service's metrics as /metrics exposes them (a counter's name with `_total`)."""
    metrics = ServiceMetrics()
    wrappers = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    rows = {
        Row(m._name + ("_total" if m._type == "counter" else ""), m._type, frozenset(m._labelnames))
        for m in wrappers
    }
    # every family of the exposition is one of the objects above (none registered elsewhere),
    # but for the engine's own (`vllm:*`), exposed beside them once a vLLM engine has run in the
    # process (another test's, in a full run)
    exposed = {
        (f.name + ("_total" if f.type == "counter" else ""), f.type)
        for f in text_string_to_metric_families(metrics.render().decode())
        if not f.name.startswith(ENGINE_METRIC_PREFIX)
    }
    assert exposed == {(r.name, r.kind) for r in rows}
    return rows


def test_the_table_is_read() -> None:
    rows = documented()
    assert len(rows) >= 10
    assert (
        Row("medtpe_request_latency_seconds", "histogram", frozenset({"endpoint", "task"})) in rows
    )


def test_every_registered_metric_is_documented() -> None:
    missing = registered() - documented()
    assert not missing, (
        f"metrics missing from docs/architecture.md's table (or other labels): {missing}"
    )


def test_every_documented_metric_is_registered() -> None:
    unknown = documented() - registered()
    assert not unknown, f"docs/architecture.md's table names metrics the service lacks: {unknown}"
