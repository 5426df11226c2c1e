"""A CDS service with several tasks (`MEDTPE_CDS_SERVICE_TASKS`) on the instant engine: one read
of the patient's record from the test FHIR server, one card per task, each its own signed ledger
row that `medtpe verify`'s path re-derives, the tasks after the first answered from the record
the engine computed for the first (its prefix cache); feedback per card; the services left
single-task answer as before."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import select
from starlette.testclient import TestClient

from medtpe.cli.ledger_commands import RecordSource
from medtpe.core.cds.services import SERVICES, get_service
from medtpe.core.tasks import get_task, list_tasks
from medtpe.inference.engines.instant import PrefixCache
from medtpe.ledger.schema import Feedback
from medtpe.ledger.signing import public_key_from_jwk
from medtpe.ledger.store import Ledger
from medtpe.ledger.verification import check_row
from medtpe.service.settings import ServiceSettings
from tests.support.cds_support import ICU_PATIENT, hook_request, load_bundle, prefetch_of
from tests.support.ehr import Ehr
from tests.support.fhir_server import requests_served
from tests.support.hostile_fhir import audit_lines
from tests.support.rederived import rederived_checks, service_model_files
from tests.support.service_support import (
    SERVICE_API_KEY,
    instant_client,
    instant_settings,
    metric_value,
)

ICU = get_service("medtpe-icu-mortality-patient-view")
SINGLE = get_service("medtpe-icu-mortality-encounter-start")
TASKS = ["icu_mortality", "readmission_30d"]
BASE = "http://testserver"
API_KEY = {"Authorization": f"Bearer {SERVICE_API_KEY}"}
REUSED = "medtpe_prefill_reused_tokens_total"
LATENCY = "medtpe_request_latency_seconds_count"


@pytest.fixture(scope="module")
def ledger_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ledger of the module's own that keeps each row's record (for re-derivation)."""
    return f"sqlite:///{tmp_path_factory.mktemp('ledger') / 'ledger.sqlite3'}"


@pytest.fixture(scope="module")
def client(
    service_files: tuple[Path, Path], ehr: Ehr, fhir_server: str, ledger_url: str
) -> Iterator[TestClient]:
    """The app with the ICU patient-view service predicting two tasks, the others their own."""
    settings = instant_settings(
        service_files,
        ledger_url=ledger_url,
        ledger_records="store",
        cds_issuers=json.loads(ehr.issuers_setting([fhir_server])),
        cds_base_url=BASE,
        cds_allow_http_fhir=True,
        cds_service_tasks={ICU.id: TASKS},
    )
    with instant_client(settings) as client:
        yield client


def call(client: TestClient, ehr: Ehr, body: dict[str, Any], service_id: str) -> Any:
    url = f"/cds-services/{service_id}"
    answer = client.post(url, json=body, headers=ehr.authorization(BASE + url))
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_two_tasks_are_two_cards_from_one_read_of_the_record(
    client: TestClient, ehr: Ehr, fhir_server: str, service_files: tuple[Path, Path]
) -> None:
    engine = client.app.state.service.engine
    engine.prefix_cache = PrefixCache()  # nothing of the patient computed before
    metrics = client.get("/metrics", headers=API_KEY).text
    reused_before = metric_value(metrics, REUSED, door="cds-hooks")
    calls_before = metric_value(metrics, LATENCY, endpoint="cds_hook", task="mixed")
    served_before = requests_served(fhir_server)
    cards = call(client, ehr, hook_request(ICU, ICU_PATIENT, fhir_server=fhir_server), ICU.id)
    # one read of the record: each prefetch template fetched once, not once per task
    assert requests_served(fhir_server) - served_before == len(ICU.prefetch)
    first, second = cards["cards"]
    assert first["summary"].startswith(get_task(TASKS[0]).title + ": ")
    assert second["summary"].startswith(get_task(TASKS[1]).title + ": ")
    assert first["uuid"] != second["uuid"]
    # the record prefilled once (up to where the two prompts part), then read by both tasks
    one, two = engine.prompts[-2:]
    shared = next(i for i, (a, b) in enumerate(zip(one, two, strict=False)) if a != b)
    prefilled = engine.prefills[-1]
    assert 128 <= len(prefilled) <= shared and one[: len(prefilled)] == prefilled
    metrics = client.get("/metrics", headers=API_KEY).text
    reused = metric_value(metrics, REUSED, door="cds-hooks") - reused_before
    assert reused == 2 * (len(prefilled) // 128 * 128)
    # one call, timed once, under the label of a request of several tasks
    assert metric_value(metrics, LATENCY, endpoint="cds_hook", task="mixed") == calls_before + 1
    assert engine.cache_salts[-1] == engine.cache_salts[-2]
    # each card its own signed row, which medtpe verify's path re-derives
    key = public_key_from_jwk(client.get("/ledger/public-key").json())
    ledger = Ledger.open(client.app.state.service.settings.ledger.ledger_url)
    try:
        for card, task in zip((first, second), TASKS, strict=True):
            row = ledger.get(card["extension"]["prediction_id"])
            assert row is not None and row.prediction_id == card["uuid"]
            assert (row.task, row.site, row.door) == (task, ICU.id, "cds_hook")
            assert card["extension"]["receipt"]["receipt"] == json.loads(row.receipt)
            receipt, checks = check_row(row, key)
            assert receipt is not None and all(check.ok for check in checks), checks
            again = rederived_checks(row, RecordSource(), service_model_files(service_files))
            assert all(check.ok for check in again.values()), again
            assert again["prompt"].detail == "same prompt"
    finally:
        ledger.close()


def test_the_same_record_again_is_two_cards_from_the_score_cache(
    client: TestClient, ehr: Ehr, caplog: pytest.LogCaptureFixture
) -> None:
    body = hook_request(ICU, ICU_PATIENT, prefetch=prefetch_of(ICU, load_bundle(), ICU_PATIENT))
    engine = client.app.state.service.engine
    client.app.state.cds_hooks.scores.store.clear()
    first = call(client, ehr, body, ICU.id)["cards"]
    n_prompts = len(engine.prompts)
    with caplog.at_level(logging.INFO):
        again = call(client, ehr, body | {"hookInstance": "again"}, ICU.id)["cards"]
    assert len(engine.prompts) == n_prompts and len(again) == 2
    assert all("an earlier call's score" in card["detail"] for card in again)
    assert {card["uuid"] for card in again}.isdisjoint(card["uuid"] for card in first)
    (audit,) = [line for line in audit_lines(caplog) if line.get("hookInstance") == "again"]
    assert audit["outcome"] == "cached"
    assert audit["card"] == " ".join(card["uuid"] for card in again)


def test_feedback_is_taken_per_card(client: TestClient, ehr: Ehr, ledger_url: str) -> None:
    body = hook_request(ICU, ICU_PATIENT, prefetch=prefetch_of(ICU, load_bundle(), ICU_PATIENT))
    cards = call(client, ehr, body, ICU.id)["cards"]
    items = [
        {
            "card": cards[0]["uuid"],
            "outcome": "accepted",
            "acceptedSuggestions": [{"id": cards[0]["suggestions"][0]["uuid"]}],
            "outcomeTimestamp": "2026-11-25T10:05:31Z",
        },
        {
            "card": cards[1]["uuid"],
            "outcome": "overridden",
            "overrideReason": {"reason": cards[1]["overrideReasons"][0]},
            "outcomeTimestamp": "2026-11-25T10:06:00Z",
        },
    ]
    url = f"/cds-services/{ICU.id}/feedback"
    answer = client.post(url, json={"feedback": items}, headers=ehr.authorization(BASE + url))
    assert answer.status_code == 200, answer.text
    ledger = Ledger.open(ledger_url)
    try:
        with ledger.engine.connect() as connection:
            kept = connection.execute(select(Feedback)).mappings().all()
    finally:
        ledger.close()
    assert {(k["prediction_id"], k["outcome"]) for k in kept} == {
        (cards[0]["uuid"], "accepted"),
        (cards[1]["uuid"], "overridden"),
    }


def test_a_single_task_service_keeps_its_one_card_and_one_read(
    client: TestClient, ehr: Ehr, fhir_server: str
) -> None:
    served_before = requests_served(fhir_server)
    body = hook_request(SINGLE, ICU_PATIENT, fhir_server=fhir_server)
    (card,) = call(client, ehr, body, SINGLE.id)["cards"]
    assert requests_served(fhir_server) - served_before == len(SINGLE.prefetch)
    assert card["summary"] == "ICU mortality: high risk (75%)"
    assert card["extension"]["prediction_id"] == card["uuid"]


def test_discovery_names_the_tasks_of_a_service_with_several(client: TestClient, ehr: Ehr) -> None:
    answer = client.get("/cds-services", headers=ehr.authorization(BASE + "/cds-services"))
    described = {s["id"]: s for s in answer.json()["services"]}
    assert set(described) == {s.id for s in SERVICES}
    several = described[ICU.id]
    assert several["hook"] == ICU.hook and several["prefetch"] == dict(ICU.prefetch)
    assert several["description"].startswith(ICU.description)
    assert "ICU mortality; 30-day readmission." in several["description"]
    for service in SERVICES:
        if service.id != ICU.id:
            assert described[service.id]["description"] == service.description


def test_the_tasks_setting_is_checked_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task alone is a list of one; an unknown task or service, no task or a task twice stops
    the start naming the setting (and the known tasks)."""
    alone = ServiceSettings(cds_service_tasks={ICU.id: "readmission_30d"})
    assert alone.cds_tasks(ICU) == ("readmission_30d",) and alone.cds_tasks(SINGLE) == (
        SINGLE.task,
    )
    monkeypatch.setenv("MEDTPE_CDS_SERVICE_TASKS", json.dumps({ICU.id: TASKS}))
    assert ServiceSettings().cds_tasks(ICU) == tuple(TASKS)
    with pytest.raises(ValidationError) as unknown:
        ServiceSettings(cds_service_tasks={ICU.id: ["icu_mortality", "icu_mortalty"]})
    message = str(unknown.value)
    assert f"MEDTPE_CDS_SERVICE_TASKS[{ICU.id!r}]" in message and "'icu_mortalty'" in message
    assert f"known tasks: {', '.join(list_tasks())}" in message
    refused = {
        "no-such-service": {"no-such-service": TASKS},
        "names no task": {ICU.id: []},
        "names a task twice": {ICU.id: ["icu_mortality", "icu_mortality"]},
    }
    for reason, value in refused.items():
        with pytest.raises(ValidationError, match=reason):
            ServiceSettings(cds_service_tasks=value)
