"""Whatever an outside caller sends — any JSON shape in any field, bodies nested 10,000 deep, bytes
that are no UTF-8, lone surrogates, header values of any bytes — `/predict`, `/predict/batch`,
`/tokenize` and the CDS hooks (each call with a valid JWT) answer with a 4xx whose JSON body
locates the problem, or a legitimate answer (200; 412 when a hook's data cannot be had); never a
500. The last resort behind them answers a 500 with a generic body and logs only the
exception's type and route."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from medtpe.core.cds.services import get_service
from medtpe.inference.engines.instant import InstantEngine
from medtpe.service.app import create_app
from tests.support.bad_requests import (
    API_BODIES,
    DEEP,
    HEADER_BYTES,
    JSON,
    assert_answered,
    encoded,
    hook_bodies,
    mutated,
)
from tests.support.cds_support import ICU_PATIENT, hook_request, load_bundle, prefetch_of
from tests.support.ehr import CLOSED_FHIR_SERVER, Ehr
from tests.support.properties import examples
from tests.support.service_support import (
    AUTH,
    instant_client,
    instant_settings,
    metric_value,
    record,
    synthetic_events,
)

BASE = "http://testserver"
JSON_TYPE = {"Content-Type": "application/json"}
ICU = get_service("medtpe-icu-mortality-patient-view")
DISCHARGE = get_service("medtpe-readmission-30d-encounter-discharge")
API_ANSWERS = {200, 413, 422}
HOOK_ANSWERS = {200, 412, 422}
FUZZ = settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def client(service_files: tuple[Path, Path], ehr: Ehr) -> Iterator[TestClient]:
    """The app with API keys and `ehr` allowed to name one FHIR server: a closed port here."""
    hooks = ehr.service_settings(BASE, CLOSED_FHIR_SERVER)
    settings = instant_settings(
        service_files, **hooks, cds_allow_http_fhir=True, cds_fhir_timeout_s=2.0
    )
    with instant_client(settings) as client:
        yield client


FHIR_RECORD = {"task": "icu_mortality", "bundle": load_bundle()}
VALID_BODIES = {
    "/predict": [record(5, 8), FHIR_RECORD],
    "/predict/batch": [{"records": [record(5, 8), FHIR_RECORD]}],
    "/tokenize": [
        {"text": "Heart rate 87 bpm"},
        record(5, 8, prediction_time="2150-01-01"),
        {"tasks": ["phenotyping", "icu_mortality"], "events": synthetic_events(5, 8)},
    ],
}
"""Requests each route answers; the property tests break them at any depth."""


@pytest.mark.parametrize("path", list(API_BODIES))
@FUZZ
@given(data=st.data())
def test_any_api_body_is_answered_never_500(client: TestClient, path: str, data) -> None:
    """Valid requests with values removed or replaced anywhere, the route's fields with any
    values, any JSON; sometimes broken as JSON (`encoded`)."""
    broken = st.sampled_from(VALID_BODIES[path]).flatmap(mutated)
    body = data.draw(encoded(broken | API_BODIES[path] | JSON), "body")
    answer = client.post(path, content=body, headers=AUTH | JSON_TYPE)
    event(f"status {answer.status_code}")  # pytest --hypothesis-show-statistics
    assert_answered(answer, API_ANSWERS)


@FUZZ
@given(
    name=st.sampled_from(["authorization", "x-api-key", "content-type"]),
    value=HEADER_BYTES | st.sampled_from([b"Bearer \xff\xfe", b"Bearer t\xc3\xabst-key-1"]),
)
def test_any_header_value_is_answered_never_500(
    client: TestClient, name: str, value: bytes
) -> None:
    headers = {k.lower(): v for k, v in (AUTH | JSON_TYPE).items()} | {name: value}
    answer = client.post("/tokenize", content=b'{"text": "heart rate 87"}', headers=headers)
    event(f"status {answer.status_code}")
    assert_answered(answer, {200, 401, 422})


def _deep(inner: bytes = b"1") -> bytes:
    return b"[" * DEEP + inner + b"]" * DEEP


RECORD = json.dumps({"task": "icu_mortality", "events": [{"subject_id": 1, "code": "X"}]})
BAD_BODIES = {
    "nested 10,000 deep": _deep(),
    "a field nested 10,000 deep": b'{"task": ' + _deep() + b"}",
    "events nested 10,000 deep": b'{"task": "icu_mortality", "events": ' + _deep() + b"}",
    "a bundle resource nested 10,000 deep": b'{"task": "icu_mortality", "bundle": {"resourceType"'
    b': "Bundle", "type": "collection", "entry": [{"resource": ' + _deep(b"{}") + b"}]}}",
    "a byte that is no UTF-8": RECORD.replace("X", "\udcff", 1).encode(errors="surrogateescape"),
    "an encoded surrogate": b'{"text": "\xed\xa0\x80"}',
    "a lone surrogate escape in text": b'{"text": "a\\ud800b"}',
    "a lone surrogate escape in a code": RECORD.replace("X", "\\udc00").encode(),
    "NaN": b'{"text": NaN}',
    "an empty body": b"",
    "a UTF-16 body": '{"text": "x"}'.encode("utf-16"),
}


@pytest.mark.parametrize("path", list(API_BODIES))
@pytest.mark.parametrize("body", list(BAD_BODIES.values()), ids=list(BAD_BODIES))
def test_bodies_no_decoder_reads_are_422s_locating_them(
    client: TestClient, path: str, body: bytes
) -> None:
    answer = client.post(path, content=body, headers=AUTH | JSON_TYPE)
    assert_answered(answer, {422})


@pytest.mark.parametrize("path", list(API_BODIES))
def test_a_key_of_any_bytes_is_a_401_naming_the_header(client: TestClient, path: str) -> None:
    for header, value in [
        ("authorization", b"Bearer t\xc3\xabst-key-1"),
        ("authorization", b"Bearer \xe9\xff"),
        ("x-api-key", b"\xc3\xa9"),
    ]:
        answer = client.post(path, content=_deep(), headers=JSON_TYPE | {header: value})
        assert_answered(answer, {401})
        assert answer.json()["detail"][0]["loc"] == ["header", header]


def hook_call(client: TestClient, ehr: Ehr, body: bytes, service_id: str = ICU.id):
    """POST `body` to the service with a JWT of `ehr` for exactly that URL."""
    url = f"/cds-services/{service_id}"
    return client.post(url, content=body, headers=JSON_TYPE | ehr.authorization(BASE + url))


@pytest.mark.parametrize("service", [ICU, DISCHARGE], ids=lambda s: s.hook)
@FUZZ
@given(data=st.data())
def test_any_hook_body_is_answered_never_500(client: TestClient, ehr: Ehr, service, data) -> None:
    """The EHR's own call broken at any depth, hook bodies with any values, any JSON."""
    prefetch = prefetch_of(service, load_bundle(), ICU_PATIENT)
    broken = mutated(hook_request(service, ICU_PATIENT, prefetch=prefetch))
    body = data.draw(encoded(broken | hook_bodies(service) | JSON), "body")
    answer = hook_call(client, ehr, body, service.id)
    event(f"status {answer.status_code}")
    assert_answered(answer, HOOK_ANSWERS)


def _with_patient(resource: bytes) -> bytes:
    """A hook call whose prefetched Patient is `resource` (the other keys as the EHR sends)."""
    request = hook_request(ICU, ICU_PATIENT, prefetch=prefetch_of(ICU, load_bundle(), ICU_PATIENT))
    request["prefetch"]["patient"] = "PATIENT"
    return json.dumps(request).encode().replace(b'"PATIENT"', resource)


BAD_HOOK_BODIES = {
    "nested 10,000 deep": _deep(),
    "a prefetch resource nested 10,000 deep": _with_patient(_deep(b"{}")),
    "a prefetch resource nested 900 deep": _with_patient(
        b'{"resourceType": "Patient", "id": "cds-patient-1", "extension": '
        + b"[" * 900
        + b"]" * 900
        + b"}"
    ),
    "a byte that is no UTF-8": _with_patient(b'{"resourceType": "Patient", "id": "\xff"}'),
    "a lone surrogate escape": _with_patient(b'{"resourceType": "Patient", "id": "\\ud800"}'),
    "NaN": _with_patient(b'{"resourceType": "Patient", "id": NaN}'),
    "an empty body": b"",
}


@pytest.mark.parametrize("body", list(BAD_HOOK_BODIES.values()), ids=list(BAD_HOOK_BODIES))
def test_hook_bodies_no_decoder_reads_are_422s(client: TestClient, ehr: Ehr, body: bytes) -> None:
    assert_answered(hook_call(client, ehr, body), {422})


def test_a_jwt_of_any_bytes_is_a_bare_401(client: TestClient) -> None:
    for value in (b"Bearer \xff\xfe.\xc3.x", b"Bearer " + "é.é.é".encode()):
        answer = client.post(
            f"/cds-services/{ICU.id}", content=b"{", headers={"authorization": value}
        )
        assert (answer.status_code, answer.content) == (401, b"")


def test_the_last_resort_is_a_generic_500_naming_only_type_and_route(
    service_files: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(instant_settings(service_files), InstantEngine.factory())

    @app.post("/broken/{name}")
    async def broken(name: str) -> None:
        raise ValueError(f"record content {name}")

    with caplog.at_level(logging.INFO):
        answer = TestClient(app).post("/broken/cds-patient-1", content=b"secret body")
    assert answer.status_code == 500
    assert answer.json() == {"error": "internal", "detail": "internal error"}
    service = [r for r in caplog.records if not r.name.startswith("httpx")]  # the client's own
    logged = "\n".join(r.getMessage() for r in service)
    assert "internal error ValueError on POST /broken/{name}" in logged
    assert "record content" not in logged and "cds-patient-1" not in logged
    assert "secret body" not in logged and "Traceback" not in caplog.text
    metrics = TestClient(app).get("/metrics", headers=AUTH).text
    assert metric_value(metrics, "medtpe_errors_total", reason="internal") == 1
