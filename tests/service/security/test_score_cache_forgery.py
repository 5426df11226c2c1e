"""A score written into the state store by anyone but the service never becomes a card or a
signed ledger row: the CDS hook on the instant engine, its state in this process's memory and on
a real redis-server; the score cache's entries forged straight in the store (a lower risk, the
entry's MAC missing, kept from the original or made with another key). Each is a miss: the
model answers again, the card shows its own score, the new row's receipt is the recomputed
answer's, `medtpe_state_score_entries_refused_total` counts the entries refused; the entry is
written again with the service's MAC and is a hit as before."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis
from starlette.testclient import TestClient

from medtpe.core.cds.services import get_service
from medtpe.ledger.store import Ledger, PredictionRow
from medtpe.service.cds_hooks.state_store import MAC_BYTES, LocalStore, RedisStore
from tests.support.cds_support import ICU_PATIENT, hook_request, load_bundle, prefetch_of
from tests.support.ehr import CLOSED_FHIR_SERVER, Ehr
from tests.support.redis_server import STATE_KEY
from tests.support.service_support import AUTH, instant_client, instant_settings, metric_value

ICU = get_service("medtpe-icu-mortality-patient-view")
BASE = "http://testserver"
URL = f"/cds-services/{ICU.id}"
FORGED_P = 0.01
"""The probability the forged entries carry ("low risk (1%)")."""


@pytest.fixture(scope="module", params=["local", "redis"])
def client(
    request: pytest.FixtureRequest, service_files: tuple[Path, Path], ehr: Ehr
) -> Iterator[TestClient]:
    """The hooks with their state in memory (`local`) or on a redis-server (`redis`)."""
    values: dict[str, Any] = {
        "cds_issuers": json.loads(ehr.issuers_setting([CLOSED_FHIR_SERVER])),
        "cds_base_url": BASE,
    }
    if request.param == "redis":
        values |= {"state_url": request.getfixturevalue("redis_server").url}
        values |= {"state_key": STATE_KEY}
    with instant_client(instant_settings(service_files, **values)) as client:
        yield client


def store_of(client: TestClient) -> LocalStore | RedisStore:
    """The app's state store."""
    store = client.app.state.cds_hooks.scores.store
    assert isinstance(store, LocalStore | RedisStore)
    return store


def score_entries(client: TestClient) -> dict[str, bytes]:
    """Every score entry the app's store holds, by key."""
    store = store_of(client)
    if isinstance(store, LocalStore):
        names = [k for k in store.held_keys() if k.startswith("medtpe:score:")]
        return dict(zip(names, asyncio.run(store.get_many(names)), strict=True))
    with Redis.from_url(store.url) as redis:
        names = sorted(k.decode() for k in redis.keys("medtpe:score:*"))
        return dict(zip(names, redis.mget(names), strict=True))


def write(client: TestClient, entries: dict[str, bytes]) -> None:
    """Write `entries` straight into the app's store (as anyone reaching it could)."""
    store = store_of(client)
    if isinstance(store, LocalStore):
        asyncio.run(store.put(entries, 3600))
        return
    with Redis.from_url(store.url) as redis:
        redis.mset(entries)


def empty(client: TestClient) -> None:
    """No score kept."""
    store = store_of(client)
    if isinstance(store, LocalStore):
        store.clear()
        return
    with Redis.from_url(store.url) as redis:
        redis.flushdb()


def forged(name: str, entry: bytes, attack: str) -> bytes:
    """The service's `entry` under `name`, its score's p("yes") lowered to `FORGED_P`: with no
    MAC (`no_mac`), with the entry's own MAC (`altered`), with a MAC made by another key
    (`other_key`)."""
    payload = json.loads(entry[MAC_BYTES:])
    payload["score"]["p_yes"] = FORGED_P
    text = json.dumps(payload).encode()
    if attack == "no_mac":
        return text
    if attack == "altered":
        return entry[:MAC_BYTES] + text
    other = hmac.new(b"another-key" * 4, name.encode() + b"\x00" + text, hashlib.sha256)
    return other.hexdigest().encode() + text


def call(client: TestClient, ehr: Ehr) -> httpx.Response:
    """The patient-view hook on the ICU patient's prefetched record."""
    body = hook_request(ICU, ICU_PATIENT, prefetch=prefetch_of(ICU, load_bundle(), ICU_PATIENT))
    answer = client.post(URL, json=body, headers=ehr.authorization(BASE + URL))
    assert answer.status_code == 200, answer.text
    return answer


def refused(client: TestClient) -> float:
    """`medtpe_state_score_entries_refused_total{reason="unauthenticated"}`."""
    text = client.get("/metrics", headers=AUTH).text
    return metric_value(text, "medtpe_state_score_entries_refused_total", reason="unauthenticated")


def ledger_row(client: TestClient, card: dict[str, Any]) -> PredictionRow:
    """The ledger row of `card` (its uuid is the prediction's id)."""
    ledger = Ledger.open(client.app.state.service.settings.ledger.ledger_url)
    try:
        row = ledger.get(card["uuid"])
    finally:
        ledger.close()
    assert row is not None
    return row


@pytest.mark.parametrize("attack", ["no_mac", "altered", "other_key"])
def test_a_forged_score_is_a_miss_the_model_answers_again(
    client: TestClient, ehr: Ehr, attack: str
) -> None:
    engine = client.app.state.service.engine
    empty(client)
    computed = call(client, ehr).json()["cards"][0]
    model_row = ledger_row(client, computed)
    assert model_row.p_yes is not None and round(model_row.p_yes, 2) != FORGED_P
    entries = score_entries(client)
    assert len(entries) == 2  # under the sent text's digest and the events' digest
    write(client, {name: forged(name, entry, attack) for name, entry in entries.items()})
    prompts, before = len(engine.prompts), refused(client)

    recomputed = call(client, ehr).json()["cards"][0]
    assert len(engine.prompts) == prompts + 1  # the model answered again
    assert refused(client) == before + 2  # both entries looked at, both refused
    assert recomputed["summary"] == computed["summary"] and "(1%)" not in recomputed["summary"]
    assert "an earlier call's score" not in recomputed["detail"]
    row = ledger_row(client, recomputed)
    assert row.prediction_id != model_row.prediction_id
    assert (row.p_yes, row.answer) == (model_row.p_yes, model_row.answer)
    receipt = json.loads(row.receipt)
    assert receipt["p_yes"] == model_row.p_yes != FORGED_P
    assert recomputed["extension"]["receipt"]["receipt"] == receipt  # the signed answer

    again = call(client, ehr).json()["cards"][0]  # the entry the service wrote back: a hit
    assert len(engine.prompts) == prompts + 1 and refused(client) == before + 2
    assert "an earlier call's score" in again["detail"]
    assert again["summary"] == computed["summary"]
    assert json.loads(ledger_row(client, again).receipt)["p_yes"] == model_row.p_yes
