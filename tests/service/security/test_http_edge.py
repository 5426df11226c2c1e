"""The HTTP edge tried as a heavy or hostile caller: every text field has a byte cap (a located
422/413), a `Content-Length` of any bytes is a 4xx, a trickled body is cut at the request
deadline (408, on a real uvicorn socket), a client gone mid-body is counted as the client's
doing (never as an internal error, which feeds the error-rate alert), and with API keys set
nothing but the probes answers without one: `/metrics`, `/openapi.json`, `/docs`, `/redoc`
included, unless a setting opens them."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from medtpe.inference.engines.instant import InstantEngine
from medtpe.service.app import create_app
from medtpe.service.plumbing.limits import MAX_LENGTH_DIGITS
from medtpe.service.predict.schemas import MAX_EVENT_CODE_BYTES, MAX_EVENT_TEXT_BYTES
from medtpe.service.predict.task_choice import MAX_TASK_CHARS
from medtpe.service.settings import ServiceSettings
from tests.support.bad_requests import HEADER_BYTES
from tests.support.properties import examples
from tests.support.service_support import (
    AUTH,
    asgi_post_scope,
    instant_client,
    instant_settings,
    metric_value,
    post,
    record,
    served_in_thread,
)

TOKENIZE_CAP = 4096
"""The `/tokenize` text cap of these tests' app (the default is 64 KiB)."""
DESCRIPTION_PATHS = ("/openapi.json", "/docs", "/redoc")
AUTH_RAW = [(k.lower().encode(), v.encode()) for k, v in AUTH.items()]
METRICS_KEY = "scrape-token-1"


@pytest.fixture(scope="module")
def client(service_files: tuple[Path, Path]) -> Iterator[TestClient]:
    """The app with API keys (`instant_settings`), a metrics key and a small `/tokenize` text
    cap."""
    settings = instant_settings(
        service_files, max_tokenize_text_bytes=TOKENIZE_CAP, metrics_keys=[METRICS_KEY]
    )
    with instant_client(settings) as client:
        yield client


def only_item(answer: httpx.Response) -> dict[str, Any]:
    (item,) = answer.json()["detail"]
    return item


# ---------------------------------------------------------------------------- bytes, not counts


@pytest.mark.parametrize("text", ["a" * (TOKENIZE_CAP + 1), "é" * (TOKENIZE_CAP // 2 + 1)])
def test_a_tokenize_text_over_its_byte_cap_is_a_located_422(client: TestClient, text: str) -> None:
    """Bytes, not characters: 2,049 `é` are 4,098 bytes."""
    answer = post(client, "/tokenize", {"text": text})
    assert answer.status_code == 422, answer.text
    item = only_item(answer)
    assert (item["loc"], item["type"]) == (["body", "text"], "too_long")
    assert str(TOKENIZE_CAP) in item["msg"]
    assert len(answer.content) < 1024  # the refusal does not echo the text


def test_a_tokenize_text_at_its_cap_is_answered(client: TestClient) -> None:
    answer = post(client, "/tokenize", {"text": "é" * (TOKENIZE_CAP // 2)})
    assert answer.status_code == 200, answer.text
    assert answer.json()["original"]["count"] > 0


@pytest.mark.parametrize(
    ("field", "value"),
    [("code", "X" * (MAX_EVENT_CODE_BYTES + 1)), ("text_value", "é" * MAX_EVENT_TEXT_BYTES)],
)
@pytest.mark.parametrize("path", ["/predict", "/tokenize"])
def test_an_event_text_over_its_byte_cap_is_a_located_422(
    client: TestClient, path: str, field: str, value: str
) -> None:
    body = record(4, 5)
    body["events"][2][field] = value
    answer = post(client, path, body)
    assert answer.status_code == 422, answer.text
    item = only_item(answer)
    assert (item["loc"], item["type"]) == (["body", "events", field], "too_long")


def test_an_event_text_within_its_cap_is_answered(client: TestClient) -> None:
    body = record(5, 5)
    body["events"][2]["text_value"] = "a" * MAX_EVENT_TEXT_BYTES
    assert post(client, "/predict", body).status_code == 200


@pytest.mark.parametrize("path", ["/predict", "/tokenize"])
def test_a_task_name_over_its_cap_is_a_located_422(client: TestClient, path: str) -> None:
    answer = post(client, path, record(6, 5) | {"task": "t" * (MAX_TASK_CHARS + 1)})
    assert answer.status_code == 422, answer.text
    assert only_item(answer)["loc"] == ["body", "task"]


@pytest.mark.parametrize(
    "declared",
    [b"\xc2\xb2", b"1" * 5000, b"-1", b"1e3", b" 12", b"0x10", b"", "١٢".encode()],
)
def test_a_content_length_of_any_bytes_is_a_4xx(client: TestClient, declared: bytes) -> None:
    """`²` and Arabic-Indic digits are `str.isdigit()`; 5,000 digits are more than `int`
    parses: a 400 naming the header, or (digits only) a 413."""
    answer = asyncio.run(
        _asgi(client.app, "/predict", [(b"content-length", declared)], [b"{}"], complete=True)
    )
    status, body = answer
    digits = declared.isdigit()
    assert status == (413 if digits and len(declared) > MAX_LENGTH_DIGITS else 400), body
    if not digits:
        assert body["detail"][0]["loc"] == ["header", "content-length"]


@settings(max_examples=examples(200), deadline=None, derandomize=True)
@given(
    declared=HEADER_BYTES
    | st.integers(min_value=0, max_value=10**40).map(lambda n: str(n).encode())
    | st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=30).map(str.encode)
)
def test_any_content_length_is_answered_never_500(client: TestClient, declared: bytes) -> None:
    """Any bytes, any number of ASCII digits, and Unicode digits of every script."""
    status, _ = asyncio.run(
        _asgi(client.app, "/tokenize", [(b"content-length", declared)], [b'{"text": "a"}'], True)
    )
    event(f"status {status}")
    assert status in {200, 400, 413, 422}, (declared, status)


async def _asgi(
    app: Any,
    path: str,
    headers: list[tuple[bytes, bytes]],
    chunks: list[bytes],
    complete: bool = False,
) -> tuple[int, dict[str, Any]]:
    """POST `chunks` over raw ASGI, the body `complete` with the last, else a disconnect after
    it; the status and JSON body answered (0 and {} when nothing was)."""
    pulled = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        if pulled > len(chunks):
            return {"type": "http.disconnect"}
        more = pulled < len(chunks) or not complete
        return {"type": "http.request", "body": chunks[pulled - 1], "more_body": more}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = asgi_post_scope(path, [*AUTH_RAW, *headers]) | {"app": app}
    await app(scope, receive, send)
    if not sent:
        return 0, {}
    return sent[0]["status"], json.loads(sent[1]["body"])


# ---------------------------------------------------------------------------- time, disconnects


def test_a_client_gone_mid_body_is_a_client_error_not_an_internal_one(
    service_files: tuple[Path, Path],
) -> None:
    """Half a body, then the disconnect: no answer (nobody listens), counted as
    `client_disconnected`; `medtpe_errors_total` (the error-rate alert) stays empty."""
    settings = instant_settings(service_files)
    app = create_app(settings, InstantEngine.factory())
    for path in ("/predict", "/tokenize"):
        status, _ = asyncio.run(_asgi(app, path, [], [b'{"task": "icu_mort']))
        assert status == 0
    text = TestClient(app).get("/metrics", headers=AUTH).text
    assert metric_value(text, "medtpe_rejections_total", reason="client_disconnected") == 2
    assert metric_value(text, "medtpe_errors_total", reason="internal") == 0


def test_a_trickled_body_is_cut_at_the_request_deadline(service_files: tuple[Path, Path]) -> None:
    """A real uvicorn socket: headers promising 1,000 bytes, then one byte every 0.2 s. The
    service answers 408 once `MEDTPE_REQUEST_TIMEOUT_S` (1 s) has passed since the request
    began, and closes the connection."""
    settings = instant_settings(service_files, request_timeout_s=1.0)
    with served_in_thread(settings) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            head = (
                "POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Authorization: {AUTH['Authorization']}\r\nContent-Length: 1000\r\n\r\n"
            )
            sock.sendall(head.encode() + b"{")
            start = time.monotonic()
            answer = b""
            while b"\r\n\r\n" not in answer and time.monotonic() - start < 8:
                sock.settimeout(0.2)
                try:
                    answer += sock.recv(4096)
                except TimeoutError:
                    sock.sendall(b" ")
            elapsed = time.monotonic() - start
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"connection: close" in answer.lower()
        assert 0.9 < elapsed < 5, elapsed
        text = httpx.get(url + "/metrics", headers=AUTH).text
        assert metric_value(text, "medtpe_rejections_total", reason="body_timeout") == 1


# ------------------------------------------------------------------------ nothing without a key


@pytest.mark.parametrize("path", ["/metrics", *DESCRIPTION_PATHS])
def test_with_keys_metrics_and_the_description_need_one(client: TestClient, path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        answer = client.get(path, headers=headers)
        assert answer.status_code == 401, (path, answer.text)
        assert only_item(answer)["loc"][0] == "header"
    assert client.get(path, headers=AUTH).status_code == 200


def test_the_probes_and_the_page_stay_open(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 200 and "icu_mortality" in ready.json()["tasks"]
    assert client.get("/ui/").status_code == 200


def test_a_metrics_key_opens_metrics_only(client: TestClient) -> None:
    """Prometheus' token (`MEDTPE_METRICS_KEYS`) reads `/metrics` and nothing else."""
    scrape = {"Authorization": f"Bearer {METRICS_KEY}"}
    assert client.get("/metrics", headers=scrape).status_code == 200
    assert client.get("/openapi.json", headers=scrape).status_code == 401
    assert post(client, "/tokenize", {"text": "a"}, headers=scrape).status_code == 401


def test_settings_open_metrics_and_the_description(service_files: tuple[Path, Path]) -> None:
    settings = instant_settings(service_files, metrics_public=True, public_docs=True)
    with instant_client(settings) as client:
        for path in ("/metrics", *DESCRIPTION_PATHS):
            assert client.get(path).status_code == 200, path
        assert client.post("/tokenize", json={"text": "a"}).status_code == 401


def test_without_keys_everything_is_open_on_loopback(service_files: tuple[Path, Path]) -> None:
    settings = instant_settings(service_files, api_keys=[])
    assert isinstance(settings, ServiceSettings) and settings.host == "127.0.0.1"
    with instant_client(settings) as client:
        for path in ("/metrics", *DESCRIPTION_PATHS):
            assert client.get(path).status_code == 200, path
