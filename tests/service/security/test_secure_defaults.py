"""Secure defaults and authentication before work: the service listens on 127.0.0.1 unless told
otherwise, an address other machines reach needs API keys (or an explicit
`MEDTPE_ALLOW_ANONYMOUS=true`), CDS issuers need the public base URL a JWT's `aud` is checked
against (never the request's Host); a request without a valid key or JWT is refused before its
body is read, and `/tokenize` goes through the admission and deadline of `/predict`."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from starlette.testclient import TestClient

from medtpe.inference.engines.instant import InstantEngine
from medtpe.service.app import create_app
from medtpe.service.predict.schemas import API_KEY_SCHEMES
from medtpe.service.settings import ServiceSettings
from tests.support.ehr import Ehr
from tests.support.paths import ROOT
from tests.support.service_support import (
    AUTH,
    SERVICE_API_KEY,
    asgi_post_scope,
    instant_client,
    instant_settings,
    post,
    record,
)

PUBLIC_BASE = "https://cds.hospital.test.invalid"
"""The public base URL EHRs call: the in-process client's own URL is `http://testserver`."""
DISCOVERY = "/cds-services"
HOOK = "/cds-services/medtpe-icu-mortality-patient-view"
API_PATHS = ("/predict", "/predict/batch", "/tokenize")


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No `MEDTPE_*` variable of the caller's environment leaks into the settings."""
    for name in [n for n in os.environ if n.upper().startswith("MEDTPE_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_the_default_listens_on_loopback_without_keys(clean_environment) -> None:
    settings = ServiceSettings()
    assert (settings.host, settings.api_keys, settings.allow_anonymous) == ("127.0.0.1", [], False)


def test_make_serve_listens_on_loopback_and_needs_no_key(clean_environment) -> None:
    found = re.search(r"^HOST \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found and found.group(1) == "127.0.0.1"
    assert ServiceSettings(host=found.group(1)).api_keys == []


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost"])
def test_loopback_addresses_need_no_key(clean_environment, host: str) -> None:
    assert ServiceSettings(host=host).host == host


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "192.168.0.7", "medtpe.internal"])
def test_an_address_others_reach_needs_keys_or_an_explicit_anonymous(
    clean_environment: pytest.MonkeyPatch, host: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        ServiceSettings(host=host)
    message = str(refused.value)
    assert f"MEDTPE_HOST={host}" in message
    assert "MEDTPE_API_KEYS" in message and "MEDTPE_ALLOW_ANONYMOUS=true" in message
    assert ServiceSettings(host=host, api_keys=["k"]).api_keys == ["k"]
    clean_environment.setenv("MEDTPE_ALLOW_ANONYMOUS", "true")
    assert ServiceSettings(host=host).allow_anonymous


def test_issuers_need_the_public_base_url(clean_environment, ehr: Ehr) -> None:
    issuers = json.loads(ehr.issuers_setting("*"))
    with pytest.raises(ValidationError, match="MEDTPE_CDS_BASE_URL is unset"):
        ServiceSettings(cds_issuers=issuers)
    configured = ServiceSettings(cds_issuers=issuers, cds_base_url=PUBLIC_BASE)
    assert str(configured.cds_base_url).rstrip("/") == PUBLIC_BASE


@pytest.fixture(scope="module")
def client(service_files: tuple[Path, Path], ehr: Ehr) -> Iterator[TestClient]:
    """The app with API keys and `ehr` allowed, its public base URL another than the client's."""
    settings = instant_settings(
        service_files, cds_issuers=json.loads(ehr.issuers_setting("*")), cds_base_url=PUBLIC_BASE
    )
    with instant_client(settings) as client:
        yield client


def test_a_jwt_aud_is_checked_against_the_configured_url_never_the_host(
    client: TestClient, ehr: Ehr
) -> None:
    as_received = ehr.authorization("http://testserver" + DISCOVERY)
    assert client.get(DISCOVERY, headers=as_received).status_code == 401
    attacker_host = {"Host": "attacker.test.invalid"}
    forged = ehr.authorization("http://attacker.test.invalid" + DISCOVERY)
    assert client.get(DISCOVERY, headers=forged | attacker_host).status_code == 401
    public = ehr.authorization(PUBLIC_BASE + DISCOVERY)
    assert client.get(DISCOVERY, headers=public | attacker_host).status_code == 200


@pytest.mark.parametrize("path", API_PATHS)
def test_no_key_and_a_malformed_body_is_a_401_not_a_422(client: TestClient, path: str) -> None:
    for headers in ({}, {"X-API-Key": "wrong"}, {"Authorization": b"Bearer t\xc3\xabst"}):
        headers = headers | {"Content-Type": "application/json"}
        answer = client.post(path, content=b'{"task": [1, 2', headers=headers)
        assert answer.status_code == 401, answer.text
        (item,) = answer.json()["detail"]
        assert item["loc"][0] == "header" and item["type"] == "unauthorized"
    answer = client.post(path, content=b'{"task": [1, 2', headers=AUTH)
    assert answer.status_code == 422  # with the key the body is read, and refused


def test_a_feedback_without_a_jwt_and_a_malformed_body_is_a_401(
    client: TestClient, ehr: Ehr
) -> None:
    url = HOOK + "/feedback"
    headers = {"Content-Type": "application/json"}
    assert client.post(url, content=b"{not json", headers=headers).status_code == 401
    signed = headers | ehr.authorization(PUBLIC_BASE + url)
    refused = client.post(url, content=b"{not json", headers=signed)
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body"]


def _asgi_post(
    settings: ServiceSettings, path: str, headers: dict[str, str], chunks: int
) -> tuple[int, int]:
    """POST `chunks` chunks of 64 KiB to `path` of a fresh app over raw ASGI; (the status, the
    body messages the app pulled)."""
    app = create_app(settings, InstantEngine.factory())
    pulled = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        if pulled > chunks:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": b"[" * 65536, "more_body": pulled < chunks}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope = asgi_post_scope(path, raw)
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], pulled


def test_an_unauthenticated_request_is_refused_before_its_body_is_read(
    service_files: tuple[Path, Path], ehr: Ehr
) -> None:
    """A 2 MiB streamed body (128 KiB allowed): without a valid key or JWT not one chunk of it
    is pulled; with one, the app reads it (and stops at the limit: 413)."""
    settings = instant_settings(
        service_files,
        max_request_bytes=128 * 1024,
        cds_issuers=json.loads(ehr.issuers_setting("*")),
        cds_base_url=PUBLIC_BASE,
    )
    for path in API_PATHS:
        for headers in ({}, {"X-API-Key": "wrong"}):
            assert _asgi_post(settings, path, headers, chunks=32) == (401, 0)
        status, pulled = _asgi_post(settings, path, {"X-API-Key": SERVICE_API_KEY}, chunks=32)
        assert status == 413 and pulled == 3
    for path in (HOOK, HOOK + "/feedback"):
        for headers in ({}, {"Authorization": "Bearer not-a-jwt"}):
            assert _asgi_post(settings, path, headers, chunks=32) == (401, 0)
        signed = ehr.authorization(PUBLIC_BASE + path)
        status, pulled = _asgi_post(settings, path, signed, chunks=32)
        assert status == 413 and pulled == 3


def test_tokenize_goes_through_admission_and_the_deadline(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = client.app.state.service
    with state.admission.admit(state.admission.capacity):
        for body in ({"text": "heart rate 87"}, record(3, 5)):
            full = post(client, "/tokenize", body)
            assert (full.status_code, full.json()["error"]) == (503, "queue_full")
            assert "retry-after" in full.headers
    assert post(client, "/tokenize", {"text": "heart rate 87"}).status_code == 200
    monkeypatch.setattr(state.settings, "request_timeout_s", 1e-6)
    late = post(client, "/tokenize", {"text": "Heart rate 87 bpm. " * 3_000})  # 57 KB
    assert (late.status_code, late.json()["error"]) == (504, "timeout")


def test_the_document_states_how_to_send_a_key(client: TestClient) -> None:
    """(Without keys it states none: the contract test's `ignored_auth` check would fail.)"""
    document = client.get("/openapi.json", headers=AUTH).json()
    assert document["components"]["securitySchemes"] == API_KEY_SCHEMES
    for path in API_PATHS:
        security = document["paths"][path]["post"]["security"]
        assert security == [{"bearerApiKey": []}, {"headerApiKey": []}]
