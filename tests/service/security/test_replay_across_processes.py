"""One CDS Hooks token, one use, whatever process answers: two service instances (two apps
in-process on the instant engine, as two API processes or replicas would be) sharing a real
redis-server through `MEDTPE_STATE_URL`; the store stopped and restarted mid-run; the store
refusing the score keys; and the start refused where the processes would not share the state."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from redis import Redis
from starlette.testclient import TestClient

from medtpe.core.cds.services import get_service
from medtpe.service.cds_hooks.state_store import STATE_RETRY_AFTER_S
from tests.support.cds_support import ICU_PATIENT, hook_request, load_bundle, prefetch_of
from tests.support.ehr import Ehr
from tests.support.redis_server import STATE_KEY, RedisServer
from tests.support.service_support import AUTH, instant_client, instant_settings, metric_value

CLAIM_FAILURES = "medtpe_state_store_failures_total"
BASE = "http://testserver"
ICU = get_service("medtpe-icu-mortality-patient-view")
URL = f"/cds-services/{ICU.id}"
FHIR_SERVERS = ["http://127.0.0.1:9/fhir"]
"""The issuer's FHIR servers: none is called (every call here is prefetched)."""


def hooks_settings(service_files: tuple[Path, Path], ehr: Ehr, **overrides: Any) -> Any:
    """Instant-engine settings with `ehr` allowed to call the hooks at `BASE`."""
    issuers = json.loads(ehr.issuers_setting(FHIR_SERVERS))
    return instant_settings(service_files, cds_issuers=issuers, cds_base_url=BASE, **overrides)


@pytest.fixture(scope="module")
def instances(
    service_files: tuple[Path, Path], ehr: Ehr, redis_server: RedisServer
) -> Iterator[tuple[TestClient, TestClient]]:
    """Two instances sharing the redis-server's state."""
    settings = hooks_settings(service_files, ehr, state_url=redis_server.url, state_key=STATE_KEY)
    with instant_client(settings) as first, instant_client(settings) as second:
        yield first, second


def record(n_new: int = 0) -> dict[str, Any]:
    """The ICU patient's prefetch, with `n_new` extra Observations (a record no call saw)."""
    prefetch = prefetch_of(ICU, load_bundle(), ICU_PATIENT)
    entries = prefetch["observations"]["entry"]
    for i in range(n_new):
        new = copy.deepcopy(entries[-1])
        new["resource"]["id"] = f"obs-new-{i}"
        new["resource"]["effectiveDateTime"] = f"2150-03-02T{i % 24:02d}:00:00Z"
        entries.append(new)
    return hook_request(ICU, ICU_PATIENT, prefetch=prefetch)


def prompts(client: TestClient) -> int:
    """Prompts the instance's engine has generated for."""
    return len(client.app.state.service.engine.prompts)


def test_a_token_is_accepted_by_one_instance_only(
    instances: tuple[TestClient, TestClient], ehr: Ehr
) -> None:
    first, second = instances
    for accepting, other in ((first, second), (second, first)):
        headers = ehr.authorization(BASE + URL)
        assert accepting.post(URL, json=record(), headers=headers).status_code == 200
        replayed = other.post(URL, json=record(), headers=headers)
        assert (replayed.status_code, replayed.content) == (401, b"")
        assert accepting.post(URL, json=record(), headers=headers).status_code == 401


def test_the_score_one_instance_computed_answers_the_other(
    instances: tuple[TestClient, TestClient], ehr: Ehr
) -> None:
    first, second = instances
    body = record(n_new=1)
    before = prompts(first), prompts(second)
    computed = first.post(URL, json=body, headers=ehr.authorization(BASE + URL))
    reused = second.post(URL, json=body, headers=ehr.authorization(BASE + URL))
    assert computed.status_code == reused.status_code == 200
    assert (prompts(first), prompts(second)) == (before[0] + 1, before[1])
    card, again = computed.json()["cards"][0], reused.json()["cards"][0]
    assert "an earlier call's score" in again["detail"]
    assert again["summary"] == card["summary"]


def test_a_stopped_store_makes_hook_calls_503_until_it_is_back(
    instances: tuple[TestClient, TestClient],
    ehr: Ehr,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = instances
    headers = ehr.authorization(BASE + URL)
    failed_claims = metric_value(
        first.get("/metrics", headers=AUTH).text, CLAIM_FAILURES, operation="claim"
    )
    redis_server.stop()
    try:
        with caplog.at_level(logging.INFO, logger="medtpe.audit"):
            for instance in (first, second):
                refused = instance.post(URL, json=record(), headers=headers)
                assert refused.status_code == 503
                assert refused.headers["retry-after"] == str(STATE_RETRY_AFTER_S)
                assert refused.json()["error"] == "state_unavailable"
    finally:
        redis_server.start()
    # counted and audited (without the token)
    after = metric_value(
        first.get("/metrics", headers=AUTH).text, CLAIM_FAILURES, operation="claim"
    )
    assert after == failed_claims + 1
    audited = [json.loads(r.getMessage()) for r in caplog.records if r.name == "medtpe.audit"]
    assert [(a["outcome"], a["reason"]) for a in audited] == [("error", "state_unavailable")] * 2
    assert headers["Authorization"][7:] not in caplog.text
    # the token was never accepted during the outage: once, and once only, now
    assert first.post(URL, json=record(), headers=headers).status_code == 200
    assert second.post(URL, json=record(), headers=headers).status_code == 401


def test_a_store_refusing_the_score_keys_leaves_the_hook_computing(
    instances: tuple[TestClient, TestClient], ehr: Ehr, redis_server: RedisServer
) -> None:
    """Redis's ACL lets the service claim `jti`s but not read or write scores: every score-cache
    operation fails, each call is scored by the model and answered."""
    first, _ = instances
    scores = first.app.state.cds_hooks.scores
    body = record(n_new=2)
    skipped, before = scores.skipped, prompts(first)
    with Redis.from_url(redis_server.url) as admin:
        admin.execute_command("ACL", "SETUSER", "default", "resetkeys", "~medtpe:jti:*")
        try:
            answers = [first.post(URL, json=body, headers=ehr.authorization(BASE + URL))]
            answers.append(first.post(URL, json=body, headers=ehr.authorization(BASE + URL)))
        finally:
            admin.execute_command("ACL", "SETUSER", "default", "allkeys")
    assert [a.status_code for a in answers] == [200, 200]
    assert prompts(first) == before + 2  # no score kept: the model answered twice
    assert "an earlier call's score" not in answers[1].json()["cards"][0]["detail"]
    assert scores.skipped >= skipped + 4  # two gets and two puts per call


def test_several_api_processes_with_issuers_need_the_state_url(
    service_files: tuple[Path, Path], ehr: Ehr
) -> None:
    with pytest.raises(ValidationError, match="MEDTPE_STATE_URL"):
        hooks_settings(service_files, ehr, api_workers=2)
    store = {"state_url": "redis://store:6379/0", "state_key": STATE_KEY}
    shared = hooks_settings(service_files, ehr, api_workers=2, **store)
    assert shared.state_url == "redis://store:6379/0"
    assert instant_settings(service_files, api_workers=2).state_url is None  # no hooks
    with pytest.raises(ValidationError, match="MEDTPE_STATE_URL"):
        hooks_settings(service_files, ehr, state_url="http://store:6379/0", state_key=STATE_KEY)
