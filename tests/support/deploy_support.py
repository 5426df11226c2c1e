"""Shared helpers of the deployment tests: repository paths, the metric names the service
exports (read from medtpe/service/plumbing/metrics.py's registries, and vLLM's own `vllm:` metrics
from the installed vLLM's source), the MEDTPE_* variables the code reads, and metric-name extraction
from PromQL."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.paths import ROOT

if TYPE_CHECKING:
    from medtpe.service.settings import ServiceSettings

DEPLOY = ROOT / "deploy"

# Sample-name suffixes of each metric type in the text exposition.
_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum"),
}
# vLLM's Prometheus stat logger creates its metrics through these class attributes.
_VLLM_METRIC_FACTORIES = {
    "_counter_cls": "counter",
    "_gauge_cls": "gauge",
    "_histogram_cls": "histogram",
}

# Grafana's macros and the dashboard's variable, replaced by values PromQL accepts.
GRAFANA_SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1h",
    "$task": ".*",
    "$site": ".*",
}

_PROMQL_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "inf",
        "nan",
        "atan2",
    }
)


def require_tool(name: str) -> str:
    """Path of a command-line tool from `make deps-system` / `make deps-deploy`.

    The virtual environment's bin directory is searched first (pip-installed tools)."""
    found = shutil.which(name, path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    if found is None:
        pytest.fail(f"{name} is not installed: run `make deps-system deps-deploy`")
    return found


def exported_metric_names() -> set[str]:
    """Every sample name the service's /metrics can carry, from its real registries.

    `ServiceMetrics.render()` is the exposition the service serves; every family appears in it
    (HELP/TYPE lines) even before a sample is observed, and its type gives the sample names."""
    from medtpe.service.plumbing.metrics import ServiceMetrics

    names: set[str] = set()
    for family in text_string_to_metric_families(ServiceMetrics().render().decode()):
        suffixes = _SUFFIXES.get(family.type)
        assert suffixes is not None, f"unexpected metric type {family.type} of {family.name}"
        names.update(family.name + suffix for suffix in suffixes)
    return names


def vllm_metric_names() -> set[str]:
    """Every sample name of vLLM's own metrics (merged into the service's /metrics when the
    engine keeps statistics), read from the installed vLLM's Prometheus stat logger: each
    `self._counter_cls(name="vllm:...")` (gauge, histogram) call there."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vLLM is not installed"
    source = Path(spec.submodule_search_locations[0]) / "v1" / "metrics" / "loggers.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        kind = _VLLM_METRIC_FACTORIES.get(node.func.attr)
        name = next((k.value for k in node.keywords if k.arg == "name"), None)
        if kind and isinstance(name, ast.Constant) and isinstance(name.value, str):
            names.update(name.value + suffix for suffix in _SUFFIXES[kind])
    assert "vllm:prefix_cache_hits_total" in names, f"no vLLM metric found in {source}"
    return names


def _environment_names_read_in(path: Path) -> set[str]:
    """String literals passed to os.environ.get / os.getenv / os.environ[...] in a module."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        argument: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args:
            func = ast.unparse(node.func)
            if func in {"os.environ.get", "os.getenv", "environ.get", "getenv"}:
                argument = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in {
            "os.environ",
            "environ",
        }:
            argument = node.slice
        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
            names.add(argument.value)
    return names


def medtpe_environment_names() -> set[str]:
    """The MEDTPE_* variables the code reads: the service's settings (its own and the ledger's:
    `setting_variables`) and the variables that modules read directly (paths)."""
    from medtpe.service.settings import setting_variables

    names = set(setting_variables())
    for module in (ROOT / "medtpe").rglob("*.py"):
        names.update(n for n in _environment_names_read_in(module) if n.startswith("MEDTPE_"))
    return names


def settings_from_environment(
    env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch
) -> ServiceSettings:
    """The service settings a process with exactly these MEDTPE_* variables would run with
    (pydantic validates every value)."""
    from medtpe.service.settings import ServiceSettings

    for name in [name for name in os.environ if name.startswith("MEDTPE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return ServiceSettings()


def container_environment(
    container: Mapping[str, Any],
    config_data: Mapping[str, str],
    secrets: Mapping[tuple[str, str], str],
) -> dict[str, str]:
    """The environment Kubernetes gives `container`: its ConfigMap's data (`envFrom`), then its
    `env` in order, a Secret's value looked up in `secrets` by (Secret, key), and each `$(NAME)`
    in a literal value replaced by the value of an earlier variable, as the kubelet does."""
    env = dict(config_data)
    for variable in container.get("env", []):
        if "valueFrom" in variable:
            ref = variable["valueFrom"]["secretKeyRef"]
            env[variable["name"]] = secrets[(ref["name"], ref["key"])]
            continue
        value = variable["value"]
        for name in set(re.findall(r"\$\((\w+)\)", value)) & set(env):
            value = value.replace(f"$({name})", env[name])
        env[variable["name"]] = value
    return env


def substitute_grafana_macros(expr: str) -> str:
    """A dashboard query with Grafana's macros and variables replaced (longest names first)."""
    for macro in sorted(GRAFANA_SUBSTITUTIONS, key=len, reverse=True):
        expr = expr.replace(macro, GRAFANA_SUBSTITUTIONS[macro])
    return expr


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects.

    Strings, label matchers, range/subquery brackets and grouping label lists are removed;
    what is left as an identifier not followed by `(` (a function or aggregation) and not a
    keyword is a metric name. Expressions are also parsed by promtool in the tests, so this
    only has to handle valid PromQL."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])[A-Za-z_:][\w:]*", text):
        name = match.group(0)
        if name.lower() in _PROMQL_KEYWORDS or re.match(r"\s*\(", text[match.end() :]):
            continue
        names.add(name)
    return names
