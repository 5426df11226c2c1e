"""CDS feedback on a card whose prediction the ledger does not hold: a card issued while the
ledger was off, kept as issued in the state the instances share (a real redis-server), its
feedback sent once the service runs with its ledger. The call is a 422 naming each such item's
card (`card_not_in_ledger`), nothing of it is recorded, and the refusal is audited, logged and
counted; the items the ledger holds are kept once sent without it. The real app, in-process,
on the instant engine."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from starlette.testclient import TestClient

from medtpe.core.cds.services import get_service
from medtpe.ledger.schema import Feedback
from medtpe.ledger.store import Ledger
from medtpe.service.settings import ServiceSettings
from tests.support.cds_support import ICU_PATIENT, hook_request, load_bundle, prefetch_of
from tests.support.ehr import CLOSED_FHIR_SERVER, Ehr
from tests.support.hostile_fhir import audit_lines
from tests.support.redis_server import STATE_KEY, RedisServer
from tests.support.service_support import AUTH, instant_client, instant_settings, metric_value

ICU = get_service("medtpe-icu-mortality-patient-view")
BASE = "http://testserver"
HOOK = f"/cds-services/{ICU.id}"
FEEDBACK = f"{HOOK}/feedback"


def hooks_settings(
    service_files: tuple[Path, Path], ehr: Ehr, redis: RedisServer, **values: Any
) -> ServiceSettings:
    """An instance `ehr` may call, its issued cards in `redis`."""
    return instant_settings(
        service_files,
        cds_issuers=json.loads(ehr.issuers_setting([CLOSED_FHIR_SERVER])),
        cds_base_url=BASE,
        state_url=redis.url,
        state_key=STATE_KEY,
        **values,
    )


def issued_card(client: TestClient, ehr: Ehr) -> dict[str, Any]:
    body = hook_request(ICU, ICU_PATIENT, prefetch=prefetch_of(ICU, load_bundle(), ICU_PATIENT))
    answer = client.post(HOOK, json=body, headers=ehr.authorization(BASE + HOOK))
    assert answer.status_code == 200, answer.text
    return answer.json()["cards"][0]


def send(client: TestClient, ehr: Ehr, cards: list[str]) -> httpx.Response:
    items = [
        {"card": card, "outcome": "overridden", "outcomeTimestamp": "2026-11-27T10:00:00Z"}
        for card in cards
    ]
    return client.post(
        FEEDBACK, json={"feedback": items}, headers=ehr.authorization(BASE + FEEDBACK)
    )


def counts(client: TestClient) -> tuple[float, float]:
    """(invalid requests refused, overridden cards counted) in `/metrics`."""
    text = client.get("/metrics", headers=AUTH).text
    return (
        metric_value(text, "medtpe_rejections_total", reason="invalid"),
        metric_value(text, "medtpe_cds_feedback_total", service=ICU.id, outcome="overridden"),
    )


def test_feedback_on_a_card_issued_while_the_ledger_was_off_is_a_422_naming_it(
    service_files: tuple[Path, Path],
    ehr: Ehr,
    redis_server: RedisServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with instant_client(hooks_settings(service_files, ehr, redis_server, ledger_off=True)) as off:
        unrecorded = issued_card(off, ehr)["uuid"]
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    with instant_client(hooks_settings(service_files, ehr, redis_server, ledger_url=url)) as on:
        recorded = issued_card(on, ehr)["uuid"]
        before = counts(on)
        with caplog.at_level(logging.INFO):
            refused = send(on, ehr, [recorded, unrecorded])
        assert refused.status_code == 422, refused.text
        (error,) = refused.json()["detail"]
        assert (error["loc"], error["type"]) == (
            ["body", "feedback", 1, "card"],
            "card_not_in_ledger",
        )
        assert "issued while the ledger was off" in error["msg"]
        assert counts(on) == (before[0] + 1, before[1])  # refused, no outcome counted
        lines = [line for line in audit_lines(caplog) if line.get("event") == "feedback"]
        assert [(line["outcome"], line["reason"]) for line in lines] == [
            ("invalid", "card_not_in_ledger")
        ]
        assert "without a prediction in the ledger" in caplog.text
        ledger = Ledger.open(url)
        try:
            with ledger.engine.connect() as connection:
                assert connection.execute(select(Feedback)).all() == []  # nothing of the call
            assert send(on, ehr, [recorded]).status_code == 200
            with ledger.engine.connect() as connection:
                kept = connection.execute(select(Feedback)).mappings().all()
        finally:
            ledger.close()
    assert [(k["prediction_id"], k["outcome"]) for k in kept] == [(recorded, "overridden")]
