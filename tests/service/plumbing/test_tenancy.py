"""Per-caller cache salts and the window policy setting, on the instant engine (the real
engine's cache behaviour: tests/service/test_service_api_workers.py); vLLM's metrics on
/metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY, Counter

from medtpe.core.prompt import Windowing, WindowPolicy
from medtpe.service.plumbing.metrics import ServiceMetrics
from medtpe.service.settings import ServiceSettings
from tests.support.service_support import (
    SERVICE_API_KEY,
    instant_client,
    instant_settings,
    synthetic_events,
)

EVENTS = synthetic_events(5, 40)
BODY = {"task": "icu_mortality", "events": EVENTS}


def salts_of(client, requests: list[dict[str, str]]) -> list[str | None]:
    """The cache salt each /predict (sent with these headers) reached the engine with."""
    engine = client.app.state.service.engine
    engine.cache_salts.clear()
    for headers in requests:
        assert client.post("/predict", json=BODY, headers=headers).status_code == 200
    return list(engine.cache_salts)


def test_each_api_key_gets_its_own_salt_never_the_key(service_files: tuple[Path, Path]) -> None:
    settings = instant_settings(service_files)
    with instant_client(settings) as client:
        salts = salts_of(
            client,
            [
                {"Authorization": f"Bearer {SERVICE_API_KEY}"},
                {"X-API-Key": SERVICE_API_KEY},
                {"Authorization": "Bearer test-key-2"},
            ],
        )
        expected = client.app.state.service.salts
    assert salts[0] == salts[1] == expected.of(SERVICE_API_KEY)
    assert salts[2] == expected.of("test-key-2") and salts[2] != salts[0]
    for salt, key in zip(salts, (SERVICE_API_KEY, SERVICE_API_KEY, "test-key-2"), strict=True):
        assert salt is not None and key not in salt and len(salt) == 64


def test_without_keys_the_tenant_header_salts(service_files: tuple[Path, Path]) -> None:
    settings = instant_settings(service_files, api_keys=[], cache_salt_header="X-Tenant")
    with instant_client(settings) as client:
        salts = salts_of(client, [{"X-Tenant": "ward-3"}, {"X-Tenant": "ward-4"}, {}])
        expected = client.app.state.service.salts
    assert salts == [expected.of("ward-3"), expected.of("ward-4"), None]
    assert salts[0] != salts[1]


def test_without_keys_or_header_one_shared_salt(service_files: tuple[Path, Path]) -> None:
    settings = instant_settings(service_files, api_keys=[])
    with instant_client(settings) as client:
        assert salts_of(client, [{"X-Tenant": "ward-3"}, {}]) == [None, None]


def test_window_policy_setting_reaches_the_predictor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDTPE_WINDOW_POLICY", "stable")
    monkeypatch.setenv("MEDTPE_WINDOW_GRID_HOURS", "24")
    assert ServiceSettings().model().windowing == Windowing(WindowPolicy.STABLE, 24)
    monkeypatch.setenv("MEDTPE_WINDOW_POLICY", "newest")
    with pytest.raises(ValueError, match="window_policy"):
        ServiceSettings()


def test_metrics_carry_the_engine_s_vllm_families_only() -> None:
    """vLLM registers its `vllm:` metrics in the process's default registry; /metrics appends
    them to the service's own, and nothing else of that registry (process_*, python_gc_*)."""
    probe = Counter("vllm:service_tenancy_probe", "A vLLM-named counter.", registry=REGISTRY)
    try:
        probe.inc(3)
        text = ServiceMetrics().render().decode()
    finally:
        REGISTRY.unregister(probe)
    assert "vllm:service_tenancy_probe_total 3.0" in text
    assert "medtpe_engine_ready" in text
    assert "python_gc_objects_collected_total" not in text
