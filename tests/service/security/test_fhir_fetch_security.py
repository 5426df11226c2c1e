"""The CDS Hooks fetch against a hostile FHIR server (medtpe/service/cds_hooks/fhir_fetch.py),
through the in-process app: the access token goes to the call's `fhirServer` only (a `next` link or
a redirect elsewhere is not followed, another host never sees a request), answers are cut off
while they are read, an issuer must name its FHIR servers, context values cannot change a
query, and the caller learns only `fhir_unavailable` (the audit line says what failed), whatever
the server answers: never a 500 (a property test over arbitrary JSON and bytes).

The FHIR servers are real sockets on 127.0.0.1 (tests/support/hostile_fhir.py)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from starlette.testclient import TestClient

from medtpe.core.cds.services import get_service
from medtpe.service.cds_hooks.prefetch import FHIR_UNAVAILABLE_TEXT
from medtpe.service.settings import ServiceSettings
from tests.support.cds_support import (
    FHIR_TOKEN,
    ICU_PATIENT,
    hook_request,
    load_bundle,
    prefetch_of,
)
from tests.support.ehr import Ehr
from tests.support.hostile_fhir import Answer, HostileFhir, audit_lines, hostile_fhir
from tests.support.properties import examples
from tests.support.service_support import instant_client, instant_settings

ICU = get_service("medtpe-icu-mortality-patient-view")
BASE = "http://testserver"
PREFETCH = prefetch_of(ICU, load_bundle(), ICU_PATIENT)
SEARCH_KEYS = tuple(key for key in PREFETCH if key != "patient")
MAX_ANSWER = 64 * 1024
MAX_CALL = 256 * 1024
MAX_RESOURCES = 50
TIMEOUT_S = 1.5
BEARER = f"Bearer {FHIR_TOKEN}"


@pytest.fixture(scope="module")
def anywhere(ehr: Ehr) -> Ehr:
    """Another issuer (the same keys), whose calls may name any FHIR server (`"*"`)."""
    return replace(ehr, issuer="https://anywhere.test.invalid")


@pytest.fixture(scope="module")
def client(
    service_files: tuple[Path, Path], ehr: Ehr, anywhere: Ehr, fhir: HostileFhir
) -> Iterator[TestClient]:
    """The service with small fetch limits: `ehr` may name `fhir`, `anywhere` any server."""
    issuers = json.loads(ehr.issuers_setting([fhir.url]))
    issuers |= json.loads(anywhere.issuers_setting("*"))
    settings = instant_settings(
        service_files,
        cds_issuers=issuers,
        cds_base_url=BASE,
        cds_allow_http_fhir=True,
        cds_fhir_timeout_s=TIMEOUT_S,
        cds_fhir_max_answer_bytes=MAX_ANSWER,
        cds_fhir_max_call_bytes=MAX_CALL,
        cds_fhir_max_resources=MAX_RESOURCES,
    )
    with instant_client(settings) as client:
        yield client


@pytest.fixture(scope="module")
def fhir() -> Iterator[HostileFhir]:
    """The FHIR server the test issuer may name."""
    with hostile_fhir() as server:
        yield server


@pytest.fixture(scope="module")
def other() -> Iterator[HostileFhir]:
    """Another host (another port of 127.0.0.1) no fetch may reach."""
    with hostile_fhir() as server:
        yield server


def call(
    client: TestClient,
    ehr: Ehr,
    fhir_url: str,
    missing: tuple[str, ...] = ("observations",),
    patient: str = ICU_PATIENT,
    sent: dict[str, Any] = PREFETCH,
) -> httpx.Response:
    """A hook call leaving `missing` out of the `sent` prefetch, for the service to fetch from
    `fhir_url`."""
    prefetch = {key: value for key, value in sent.items() if key not in missing}
    body = hook_request(ICU, patient, prefetch=prefetch, fhir_server=fhir_url)
    url = f"/cds-services/{ICU.id}"
    return client.post(url, json=body, headers=ehr.authorization(BASE + url))


def bundle(*resources: dict[str, Any], next_url: str | None = None) -> dict[str, Any]:
    """A searchset Bundle of `resources`, with a `next` link if given."""
    links = [{"relation": "next", "url": next_url}] if next_url else []
    entries = [{"resource": resource} for resource in resources]
    return {"resourceType": "Bundle", "type": "searchset", "entry": entries, "link": links}


def unavailable(answer: httpx.Response, caplog: pytest.LogCaptureFixture) -> str:
    """The audit detail of a call answered 412 `fhir_unavailable` and nothing else."""
    assert answer.status_code == 412, answer.text
    assert answer.json() == {"error": "fhir_unavailable", "detail": FHIR_UNAVAILABLE_TEXT}
    audit = audit_lines(caplog)[-1]
    assert (audit["outcome"], audit["reason"]) == ("precondition", "fhir_unavailable")
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert FHIR_TOKEN not in logged
    return audit["detail"]


@pytest.mark.parametrize(
    "link",
    [
        "{other}/fhir/Observation?u={base}",  # another host, the base URL in its query
        "http://127.0.0.1:{port}@127.0.0.1:{other_port}/fhir/Observation",  # user info
        "http://localhost:{port}/fhir/Observation",  # the same server under another name
        "https://127.0.0.1:{port}/fhir/Observation",  # another scheme
        "{base}x/Observation",  # a path that only starts like the base's
        "{base}/../admin",  # out of the base's path (normalised)
        "{base}/%2e%2E/admin",  # out of it for a server decoding %2E
    ],
)
def test_a_next_link_off_the_server_is_not_followed(
    client: TestClient,
    ehr: Ehr,
    fhir: HostileFhir,
    other: HostileFhir,
    caplog: pytest.LogCaptureFixture,
    link: str,
) -> None:
    caplog.set_level(logging.INFO, logger="medtpe.audit")
    port, other_port = (urlsplit(server.origin).port for server in (fhir, other))
    next_url = link.format(other=other.origin, base=fhir.url, port=port, other_port=other_port)
    fhir.answer_all(Answer.json(bundle(next_url=next_url)))
    other.answer_all(Answer.json(bundle()))
    detail = unavailable(call(client, ehr, fhir.url), caplog)
    assert "prefetch observations: a link or redirect leaving fhirServer" in detail
    assert other.requests == []
    assert [seen.authorization for seen in fhir.requests] == [BEARER]  # the first page only


def test_redirects_are_followed_on_the_server_only(
    client: TestClient,
    ehr: Ehr,
    fhir: HostileFhir,
    other: HostileFhir,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="medtpe.audit")
    other.answer_all(Answer.json(bundle()))
    fhir.answer_all(Answer(302, headers={"Location": f"{other.url}/Observation"}))
    assert "leaving fhirServer" in unavailable(call(client, ehr, fhir.url), caplog)
    assert other.requests == [] and len(fhir.requests) == 1

    moved = f"{fhir.url}/moved/Observation?patient={ICU_PATIENT}"
    fhir.answer_all(Answer(307, headers={"Location": moved}))
    fhir.respond = lambda path: (
        Answer.json(bundle()) if "/moved/" in path else Answer(307, headers={"Location": moved})
    )
    assert call(client, ehr, fhir.url).status_code == 200
    assert [urlsplit(seen.path).path for seen in fhir.requests] == [
        "/fhir/Observation",
        "/fhir/moved/Observation",
    ]
    assert {seen.authorization for seen in fhir.requests} == {BEARER}

    fhir.answer_all(Answer(302, headers={"Location": f"{fhir.url}/Observation"}))
    assert "more than 3 redirects" in unavailable(call(client, ehr, fhir.url), caplog)
    assert len(fhir.requests) == 4


def test_an_answer_over_the_cap_is_cut_off_while_it_is_read(
    client: TestClient, ehr: Ehr, fhir: HostileFhir, caplog: pytest.LogCaptureFixture
) -> None:
    """64 MiB streamed without a length: the service stops reading past 64 KiB and closes the
    connection, so the server's writes fail long before the end."""
    caplog.set_level(logging.INFO, logger="medtpe.audit")
    chunk, repeat = b" " * 16 * 1024, 4096
    fhir.answer_all(Answer(body=chunk, repeat=repeat))
    detail = unavailable(call(client, ehr, fhir.url), caplog)
    assert f"an answer over {MAX_ANSWER:,} bytes" in detail
    deadline = time.monotonic() + 10
    while not fhir.broken and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fhir.broken
    assert fhir.sent < len(chunk) * repeat // 4


def test_a_calls_answers_together_are_capped(
    client: TestClient, ehr: Ehr, fhir: HostileFhir, caplog: pytest.LogCaptureFixture
) -> None:
    """Six searches of 50 KiB each: every answer is under the answer cap, the call is not."""
    caplog.set_level(logging.INFO, logger="medtpe.audit")
    padding = {"resourceType": "Basic", "id": "pad", "text": "x" * 50 * 1024}
    fhir.answer_all(Answer.json(bundle(padding)))
    detail = unavailable(call(client, ehr, fhir.url, missing=SEARCH_KEYS), caplog)
    assert f"answers over {MAX_CALL:,} bytes" in detail


def test_more_resources_than_the_cap_stop_the_paging(
    client: TestClient, ehr: Ehr, fhir: HostileFhir, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="medtpe.audit")
    page = bundle(*[{"resourceType": "Basic"}] * 30, next_url=f"{fhir.url}/Observation?page=2")
    fhir.answer_all(Answer.json(page))
    detail = unavailable(call(client, ehr, fhir.url), caplog)
    assert f"more than {MAX_RESOURCES} resources" in detail
    assert len(fhir.requests) == 2


def test_a_dripping_answer_is_cut_at_the_deadline(
    client: TestClient, ehr: Ehr, fhir: HostileFhir, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="medtpe.audit")
    fhir.answer_all(Answer(body=b" ", repeat=200, pause_s=0.05))
    start = time.monotonic()
    detail = unavailable(call(client, ehr, fhir.url), caplog)
    assert f"no answer within {TIMEOUT_S:g} s" in detail
    assert time.monotonic() - start < TIMEOUT_S + 2


@pytest.mark.parametrize("servers", [None, [], ""])
def test_an_issuer_without_fhir_servers_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, ehr: Ehr, servers: Any
) -> None:
    issuer: dict[str, Any] = {"jwks_url": ehr.jwks_url}
    if servers is not None:
        issuer["fhir_servers"] = servers
    monkeypatch.setenv("MEDTPE_CDS_ISSUERS", json.dumps({ehr.issuer: issuer}))
    with pytest.raises(ValidationError) as refused:
        ServiceSettings()
    assert "MEDTPE_CDS_ISSUERS" in str(refused.value) and ehr.issuer in str(refused.value)


def test_star_allows_any_server(
    client: TestClient, ehr: Ehr, anywhere: Ehr, other: HostileFhir
) -> None:
    other.answer_all(Answer.json(bundle()))
    refused = call(client, ehr, other.url)
    assert (refused.status_code, refused.json()["error"]) == (412, "fhir_server_not_allowed")
    assert call(client, anywhere, other.url).status_code == 200
    assert [seen.authorization for seen in other.requests] == [BEARER]


@pytest.mark.parametrize(
    ("patient", "missing", "asked"),
    [
        (
            "12&_include=*#x?y",
            ("observations",),
            "/fhir/Observation?patient=12%26_include%3D%2A%23x%3Fy&_count=500",
        ),
        ("../Patient", ("patient",), "/fhir/Patient/..%2FPatient"),
        ("a/b?c=d", ("patient",), "/fhir/Patient/a%2Fb%3Fc%3Dd"),
        ("..", ("patient",), None),  # a dot segment even encoded: not requested
    ],
)
def test_context_values_are_url_encoded_into_the_query(
    client: TestClient,
    ehr: Ehr,
    fhir: HostileFhir,
    patient: str,
    missing: tuple[str, ...],
    asked: str | None,
) -> None:
    fhir.answer_all(Answer.json(bundle()))
    answer = call(client, ehr, fhir.url, missing=missing, patient=patient)
    assert answer.status_code in (412, 422), answer.text
    assert [seen.path for seen in fhir.requests] == ([asked] if asked else [])
    if asked and "?" in asked:
        assert parse_qs(urlsplit(fhir.requests[0].path).query) == {
            "patient": [patient],
            "_count": ["500"],
        }


# --- whatever the server answers: 200, 412 or 422, never a 500 --------------------------------

_names = st.sampled_from(
    [
        "resourceType",
        "entry",
        "resource",
        "link",
        "relation",
        "url",
        "id",
        "subject",
        "reference",
        "code",
        "coding",
        "system",
        "value",
        "valueQuantity",
        "effectiveDateTime",
    ]
)
_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**64, max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(
        [
            *("Bundle", "Observation", "Patient", "next", f"Patient/{ICU_PATIENT}"),
            *("2150-03-01T09:00:00Z", "Observation?page=2", "http://127.0.0.1:9/fhir"),
        ]
    )
)
_json = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(_names | st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
_resources = st.fixed_dictionaries(
    {"resourceType": st.sampled_from(["Observation", "Patient", "Condition", "Encounter"])},
    optional={
        "id": _json,
        "subject": _json | st.just({"reference": f"Patient/{ICU_PATIENT}"}),
        "code": _json,
        "effectiveDateTime": _json,
        "valueQuantity": _json,
        "birthDate": _json,
    },
)
_bundles = st.fixed_dictionaries(
    {"resourceType": st.just("Bundle")},
    optional={
        "entry": st.lists(
            st.fixed_dictionaries({}, optional={"resource": _resources | _json}) | _json,
            max_size=3,
        )
        | _json,
        "link": st.lists(
            st.fixed_dictionaries(
                {}, optional={"relation": st.just("next") | _json, "url": _leaves}
            ),
            max_size=2,
        )
        | _json,
    },
)
_raw = st.binary(max_size=32) | st.sampled_from(
    [
        b"[" * 30_000 + b"]" * 30_000,  # nested past any parser's depth, under the cap
        b'{"resourceType": "Bundle", "entry": [{"resource": ' + b"[" * 900 + b"]" * 900 + b"}]}",
        b'{"resourceType": "Patient", "id": "\xff\xfe", "birthDate": "2100-01-01"}',
        b'{"resourceType": "Patient", "id": "\\ud800"}',
        b'{"resourceType": "Bundle", "entry": [{"resource": {"resourceType": "Observation", '
        b'"valueQuantity": {"value": 1e999}}}]}',
        b'{"resourceType": "Bundle", "entry": ["resource"]}',
        b'{"resourceType": "Bundle", "entry": [{"resource": 5}], "link": "x"}',
        b'{"resourceType": "Bundle"',
    ]
)
_searchsets = st.builds(
    lambda resources: bundle(*resources), st.lists(_resources, min_size=1, max_size=3)
)
"""Well-shaped Bundles of resources with arbitrary fields: the mapping reads them."""
_answers = (_searchsets | _json | _resources | _bundles).map(
    lambda value: json.dumps(value).encode()
) | _raw
PATIENT_ONLY = {key: PREFETCH[key] if key == "patient" else None for key in PREFETCH}
"""The prefetch of the property test: the Patient, no other data (each call maps little)."""


@settings(max_examples=examples(60), deadline=None)
@given(answer=_answers, key=st.sampled_from(["patient", "observations"]))
def test_no_answer_of_the_fhir_server_is_a_500(
    client: TestClient, ehr: Ehr, fhir: HostileFhir, answer: bytes, key: str
) -> None:
    fhir.answer_all(Answer(body=answer))
    response = call(client, ehr, fhir.url, missing=(key,), sent=PATIENT_ONLY)
    assert response.status_code in (200, 412, 422), response.text
    body = response.json()
    if response.status_code == 200:
        assert len(body["cards"]) == 1
    elif response.status_code == 412:
        assert body == {"error": "fhir_unavailable", "detail": FHIR_UNAVAILABLE_TEXT}
    else:
        assert body["error"] == "invalid_request"
        assert body["detail"][0]["loc"][:2] in (["fhirServer", key], ["body", "prefetch"])
