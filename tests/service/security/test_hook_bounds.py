"""The CDS Hooks service against a heavy or low-trust caller (medtpe/service/cds_hooks): the whole
hook call — the fetch of what the prefetch left out, the mapping, the model — runs under admission
control, inside the request deadline and in the latency metric; a path naming no service of the
discovery list is a 404 that adds no metric series; feedback is counted only for cards this
service issued to the same caller and service (kept in the shared state: in memory and on a
real redis-server), at most `MEDTPE_CDS_MAX_FEEDBACK_ITEMS` items a call; a client gone
mid-body is the client's doing, not an internal error, and a trickled body is cut at the
request deadline.

FHIR servers and the service are real sockets on 127.0.0.1 (tests/support/hostile_fhir.py,
`served_in_thread`) where concurrency or a broken connection is under test."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from medtpe.core.cds.services import SERVICES, get_service
from medtpe.service.cds_hooks.state_store import IssuedCards, LocalStore, RedisStore, StateStore
from medtpe.service.settings import ServiceSettings
from tests.support.cds_support import ICU_PATIENT, hook_request, load_bundle, prefetch_of
from tests.support.ehr import Ehr
from tests.support.hostile_fhir import Answer, HostileFhir, audit_lines, hostile_fhir
from tests.support.redis_server import STATE_KEY
from tests.support.service_support import (
    AUTH,
    free_port,
    instant_client,
    instant_settings,
    metric_value,
    served_in_thread,
)

ICU = get_service("medtpe-icu-mortality-patient-view")
OTHER = next(s for s in SERVICES if s.id != ICU.id)
BASE = "http://testserver"
PREFETCH = prefetch_of(ICU, load_bundle(), ICU_PATIENT)
WITHOUT_PATIENT = {key: value for key, value in PREFETCH.items() if key != "patient"}
"""A prefetch whose Patient the service must fetch."""
MAX_ITEMS = 5
GATE_S = 10.0
"""Longest a FHIR answer is held back while the other calls are answered."""
CALLS = 6
HOOK = f"/cds-services/{ICU.id}"
FEEDBACK = f"{HOOK}/feedback"


@pytest.fixture(scope="module")
def fhir() -> Iterator[HostileFhir]:
    """The FHIR server the test issuer may name."""
    with hostile_fhir() as server:
        yield server


def settings_for(
    service_files: tuple[Path, Path], ehr: Ehr, fhir: HostileFhir, base: str, **values: Any
) -> ServiceSettings:
    """The instant service `ehr` may call at `base`, fetching from `fhir`."""
    return instant_settings(
        service_files,
        cds_issuers=json.loads(ehr.issuers_setting([fhir.url])),
        cds_base_url=base,
        cds_allow_http_fhir=True,
        **values,
    )


def metrics(api: TestClient | str) -> str:
    """The `/metrics` text of a client's app or of a served URL."""
    if isinstance(api, str):
        return httpx.get(api + "/metrics", headers=AUTH).text
    return api.get("/metrics", headers=AUTH).text


def hook_latency(text: str) -> tuple[float, float]:
    """(count, sum) of the hook's latency histogram."""
    labels = {"endpoint": "cds_hook", "task": ICU.task}
    count = metric_value(text, "medtpe_request_latency_seconds_count", **labels)
    return count, metric_value(text, "medtpe_request_latency_seconds_sum", **labels)


# --- the whole call under admission control, the deadline and the latency metric -----------


def test_with_one_slot_and_no_queue_concurrent_calls_are_refused_before_any_fetch(
    service_files: tuple[Path, Path], ehr: Ehr, fhir: HostileFhir
) -> None:
    """Six calls at once, each leaving the Patient for the service to fetch: the one admitted
    fetches (its answer held back until the others are answered), the five others get 503
    `queue_full` at once and never reach the FHIR server; all six are in the latency metric."""
    gate = threading.Event()
    reached: list[float] = []

    def held(path: str) -> Answer:
        reached.append(time.monotonic())
        gate.wait(GATE_S)
        return Answer.json(PREFETCH["patient"])

    fhir.answer_all(Answer(404))
    fhir.respond = held
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    values = {"max_concurrency": 1, "queue_limit": 0, "cds_fhir_timeout_s": 30.0}
    answers: list[httpx.Response] = []

    def one_call() -> None:
        body = hook_request(ICU, ICU_PATIENT, prefetch=WITHOUT_PATIENT, fhir_server=fhir.url)
        headers = ehr.authorization(base + HOOK)
        answers.append(httpx.post(base + HOOK, json=body, headers=headers, timeout=60))

    with served_in_thread(settings_for(service_files, ehr, fhir, base, **values), port=port):
        before = hook_latency(metrics(base))
        threads = [threading.Thread(target=one_call) for _ in range(CALLS)]
        start = time.monotonic()
        for thread in threads:
            thread.start()
        while (len(answers) < CALLS - 1 or not reached) and time.monotonic() - start < GATE_S:
            time.sleep(0.01)
        held_s = time.monotonic() - reached[0]
        gate.set()
        for thread in threads:
            thread.join(60)
        after = hook_latency(metrics(base))
    assert sorted(a.status_code for a in answers) == [200] + [503] * (CALLS - 1)
    for refused in (a for a in answers if a.status_code == 503):
        assert refused.json()["error"] == "queue_full" and int(refused.headers["retry-after"]) > 0
    assert [seen.path for seen in fhir.requests] == [f"/fhir/Patient/{ICU_PATIENT}"]
    assert after[0] - before[0] == CALLS
    assert after[1] - before[1] >= held_s  # the admitted call's fetch is in its latency


def test_the_request_deadline_cuts_the_fetch(
    service_files: tuple[Path, Path], ehr: Ehr, fhir: HostileFhir, caplog: pytest.LogCaptureFixture
) -> None:
    """A FHIR server slower than the request deadline (but within the fetch's own timeout):
    504 `timeout` at the deadline, as for a slow model."""

    def slow(path: str) -> Answer:
        time.sleep(2.5)
        return Answer.json(PREFETCH["patient"])

    fhir.answer_all(Answer(404))
    fhir.respond = slow
    values = {"request_timeout_s": 0.8, "cds_fhir_timeout_s": 30.0}
    with instant_client(settings_for(service_files, ehr, fhir, BASE, **values)) as client:
        body = hook_request(ICU, ICU_PATIENT, prefetch=WITHOUT_PATIENT, fhir_server=fhir.url)
        start = time.monotonic()
        with caplog.at_level(logging.INFO):
            answer = client.post(HOOK, json=body, headers=ehr.authorization(BASE + HOOK))
        took = time.monotonic() - start
    assert (answer.status_code, answer.json()["error"]) == (504, "timeout")
    assert took < 2.0
    assert audit_lines(caplog)[-1]["reason"] == "timeout"


# --- only services of the discovery list are counted -----------------------------------------


@pytest.fixture(scope="module", params=["local", "redis"])
def client(
    request: pytest.FixtureRequest, service_files: tuple[Path, Path], ehr: Ehr, fhir: HostileFhir
) -> Iterator[TestClient]:
    """The service with its state in memory (`local`) or on a redis-server (`redis`)."""
    values: dict[str, Any] = {"cds_max_feedback_items": MAX_ITEMS}
    if request.param == "redis":
        values |= {"state_url": request.getfixturevalue("redis_server").url, "state_key": STATE_KEY}
    with instant_client(settings_for(service_files, ehr, fhir, BASE, **values)) as client:
        yield client


def series(text: str) -> set[str]:
    """Every sample's name and labels in a Prometheus exposition."""
    return {line.rpartition(" ")[0] for line in text.splitlines() if not line.startswith("#")}


def test_a_service_outside_the_discovery_list_is_a_404_that_adds_no_series(
    client: TestClient, ehr: Ehr
) -> None:
    body = hook_request(ICU, ICU_PATIENT, prefetch=PREFETCH)

    def unknown_calls(name: str) -> None:
        for path in (f"/cds-services/{name}", f"/cds-services/{name}/feedback"):
            signed = client.post(path, json=body, headers=ehr.authorization(BASE + path))
            assert signed.status_code == 404
            assert signed.json()["detail"][0]["loc"] == ["path", "service_id"]
            assert client.post(path, json=body).status_code == 401

    unknown_calls("not-a-service")
    first = series(metrics(client))
    names = [f"zz-{uuid.uuid4().hex}" for _ in range(10)] + ["zz%22%7D%201%0Aevil%7Ba%3D%22"]
    for name in names:
        unknown_calls(name)
    after = series(metrics(client))
    assert after == first
    assert not any("zz" in sample or "evil" in sample for sample in after)
    services = {s.id for s in SERVICES} | {"unknown", "discovery"}
    labelled = [s for s in after if s.startswith(("medtpe_cds_hook_calls", "medtpe_cds_feedback"))]
    assert all(s.split('service="')[1].split('"')[0] in services for s in labelled)


# --- feedback: only for cards this service issued to the caller ------------------------------


def issued_card(client: TestClient, ehr: Ehr, **claims: Any) -> dict[str, Any]:
    """A card the service issued to `ehr` (with `claims`)."""
    body = hook_request(ICU, ICU_PATIENT, prefetch=PREFETCH)
    answer = client.post(HOOK, json=body, headers=ehr.authorization(BASE + HOOK, **claims))
    assert answer.status_code == 200, answer.text
    return answer.json()["cards"][0]


def overridden(card: str) -> dict[str, Any]:
    """An `overridden` feedback item on `card`."""
    return {"card": card, "outcome": "overridden", "outcomeTimestamp": "2026-11-27T10:00:00Z"}


def feedback_counts(client: TestClient, service: str = ICU.id) -> tuple[float, float]:
    """(accepted, overridden) of `service` in `/metrics`."""
    text = metrics(client)
    return tuple(  # type: ignore[return-value]
        metric_value(text, "medtpe_cds_feedback_total", service=service, outcome=outcome)
        for outcome in ("accepted", "overridden")
    )


def send_feedback(
    client: TestClient, ehr: Ehr, items: list[dict[str, Any]], path: str = FEEDBACK, **claims: Any
) -> httpx.Response:
    return client.post(
        path, json={"feedback": items}, headers=ehr.authorization(BASE + path, **claims)
    )


def test_feedback_on_an_issued_card_is_counted(client: TestClient, ehr: Ehr) -> None:
    card = issued_card(client, ehr)
    before = feedback_counts(client)
    assert send_feedback(client, ehr, [overridden(card["uuid"])]).status_code == 200
    assert feedback_counts(client) == (before[0], before[1] + 1)


def test_feedback_naming_a_card_never_issued_counts_nothing(
    client: TestClient, ehr: Ehr, caplog: pytest.LogCaptureFixture
) -> None:
    """Cards never issued, issued to another tenant, or by another service: each item named
    (`loc`), the call refused whole (422), nothing counted, no audit line names them."""
    card = issued_card(client, ehr)["uuid"]
    other_tenant = issued_card(client, ehr, tenant="tenant-b")["uuid"]
    forged = str(uuid.uuid4())
    before = feedback_counts(client)
    with caplog.at_level(logging.INFO):
        items = [overridden(card), overridden(forged), overridden(card), overridden(other_tenant)]
        answer = send_feedback(client, ehr, items)
        other_service = f"/cds-services/{OTHER.id}/feedback"
        elsewhere = send_feedback(client, ehr, [overridden(card)], path=other_service)
    assert answer.status_code == 422, answer.text
    locs = [error["loc"] for error in answer.json()["detail"]]
    assert locs == [["body", "feedback", 1, "card"], ["body", "feedback", 3, "card"]]
    assert {error["type"] for error in answer.json()["detail"]} == {"unknown_card"}
    assert elsewhere.status_code == 422
    assert elsewhere.json()["detail"][0]["loc"] == ["body", "feedback", 0, "card"]
    assert feedback_counts(client) == before
    assert feedback_counts(client, OTHER.id) == (0.0, 0.0)
    lines = [line for line in audit_lines(caplog) if line.get("event") == "feedback"]
    assert [line["reason"] for line in lines] == ["unknown_card", "unknown_card"]
    assert not any(line.get("card") for line in lines)


def test_feedback_beyond_the_item_cap_is_a_422_before_any_item_is_read(
    client: TestClient, ehr: Ehr, caplog: pytest.LogCaptureFixture
) -> None:
    card = issued_card(client, ehr)["uuid"]
    before = feedback_counts(client)
    with caplog.at_level(logging.INFO):
        answer = send_feedback(client, ehr, [overridden(card)] * (MAX_ITEMS + 1))
    assert answer.status_code == 422
    (error,) = answer.json()["detail"]
    assert (error["loc"], error["type"]) == (["body", "feedback"], "too_long")
    assert str(MAX_ITEMS) in error["msg"]
    assert feedback_counts(client) == before
    assert not [line for line in audit_lines(caplog) if line.get("event") == "feedback"]
    assert send_feedback(client, ehr, [overridden(card)] * MAX_ITEMS).status_code == 200


@pytest.mark.parametrize("kind", ["local", "redis"])
def test_issued_cards_are_kept_per_caller_and_service_until_their_ttl(
    request: pytest.FixtureRequest, kind: str
) -> None:
    store: StateStore = LocalStore(100)
    if kind == "redis":
        store = RedisStore(request.getfixturevalue("redis_server").url)
    cards = IssuedCards(store, ttl_s=0.5)
    caller = ("https://ehr.test.invalid", "tenant-a")

    async def run() -> tuple[list[int], list[int], list[int]]:
        issued = [str(uuid.uuid4()) for _ in range(3)]
        for card in issued:
            await cards.issue(caller, ICU.id, card)
        never = [*issued, str(uuid.uuid4())]
        fresh = await cards.unknown(caller, ICU.id, never)
        others = [
            *await cards.unknown(("https://ehr.test.invalid", "tenant-b"), ICU.id, issued[:1]),
            *await cards.unknown(("https://other.test.invalid", "tenant-a"), ICU.id, issued[:1]),
            *await cards.unknown(caller, OTHER.id, issued[:1]),
        ]
        await asyncio.sleep(0.6)
        expired = await cards.unknown(caller, ICU.id, issued)
        await store.aclose()
        return fresh, others, expired

    fresh, others, expired = asyncio.run(run())
    assert fresh == [3]
    assert others == [0, 0, 0]
    assert expired == [0, 1, 2]


def test_issued_cards_in_memory_are_bounded_in_count_and_bytes() -> None:
    """About 0.35 KB per card (docs/configuration.md, `MEDTPE_CDS_ISSUED_CARDS`); beyond the
    count, the oldest are forgotten."""
    n = 2000
    store = LocalStore(n)
    cards = IssuedCards(store, ttl_s=60)
    caller = ("https://ehr.test.invalid", "tenant-a")
    ids = [str(uuid.uuid4()) for _ in range(2 * n)]

    async def run() -> tuple[int, list[int]]:
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            for card in ids[:n]:
                await cards.issue(caller, ICU.id, card)
            used = tracemalloc.get_traced_memory()[0] - start
        finally:
            tracemalloc.stop()
        for card in ids[n:]:
            await cards.issue(caller, ICU.id, card)
        return used, await cards.unknown(caller, ICU.id, [ids[0], ids[-1]])

    used, unknown = asyncio.run(run())
    assert used / n < 400
    assert len(store) == n and unknown == [0]


# --- a body that does not arrive -----------------------------------------------------------


@pytest.fixture(scope="module")
def served(service_files: tuple[Path, Path], ehr: Ehr, fhir: HostileFhir) -> Iterator[str]:
    """The service over HTTP on 127.0.0.1 with a 1 s request deadline: its base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    settings = settings_for(service_files, ehr, fhir, base, request_timeout_s=1.0)
    with served_in_thread(settings, port=port):
        yield base


def signed_head(ehr: Ehr, base: str) -> bytes:
    """A hook call's request line and headers, signed, announcing a 100,000-byte body."""
    return (
        f"POST {HOOK} HTTP/1.1\r\nHost: {base.removeprefix('http://')}\r\n"
        f"Authorization: Bearer {ehr.token(base + HOOK)}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    ).encode()


def test_a_client_gone_mid_body_is_no_internal_error(served: str, ehr: Ehr) -> None:
    """The hook reads its body after the JWT check; a client that closes the connection before
    the body is complete is counted as `client_disconnected`, never as an internal error (nor
    as a hook call)."""
    before = metrics(served)
    with socket.create_connection(("127.0.0.1", int(served.rpartition(":")[2]))) as sock:
        sock.sendall(signed_head(ehr, served) + b'{"hook": "patient-view", "prefetch": {')
        time.sleep(0.3)
    gone = ("medtpe_rejections_total", {"reason": "client_disconnected"})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = metrics(served)
        if metric_value(after, gone[0], **gone[1]) > metric_value(before, gone[0], **gone[1]):
            break
        time.sleep(0.05)
    kept = [("medtpe_errors_total", {"reason": "internal"})] + [
        ("medtpe_cds_hook_calls_total", {"service": ICU.id, "outcome": outcome})
        for outcome in ("error", "invalid")
    ]
    assert metric_value(after, gone[0], **gone[1]) == metric_value(before, gone[0], **gone[1]) + 1
    for name, labels in kept:
        assert metric_value(after, name, **labels) == metric_value(before, name, **labels)


def test_a_trickled_hook_body_is_cut_at_the_request_deadline(served: str, ehr: Ehr) -> None:
    """A signed call whose body does not arrive within `MEDTPE_REQUEST_TIMEOUT_S` is answered
    408 at the deadline and its connection closed."""
    port = int(served.rpartition(":")[2])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(signed_head(ehr, served) + b"{")
        answer = b""
        while b"\r\n\r\n" not in answer:
            sock.sendall(b" ")  # a byte now and then, never the whole body
            time.sleep(0.1)
            sock.setblocking(False)
            try:
                answer += sock.recv(65536)
            except BlockingIOError:
                pass
            finally:
                sock.setblocking(True)
            assert time.monotonic() - start < 5, "no answer to a trickled body"
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"connection: close" in answer.lower()
