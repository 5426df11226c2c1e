"""The write-back (`medtpe.batch.write_back`) against a hostile FHIR server of the tests' own
(tests/support/hostile_fhir.py, real sockets on 127.0.0.1): an answer dripped forever is given up
at the total deadline, an endless one at the byte cap, one nested 100,000 deep is refused before
the parser; an error's text (2 MB of it, terminal escapes, line breaks) is shown on one line, cut,
without control characters; each failure a `FhirServerError` naming the server and the bound, never
a traceback. And `If-None-Exist`: an identifier holding FHIR's search delimiters is escaped and
percent-encoded, so the FHIR server (tests/support/transaction_server.py) finds exactly the
resource written, while the ids the product writes give the header they always had."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import unquote_plus

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from medtpe.batch.bulk_client import ServerAccess
from medtpe.batch.fhir_http import MAX_SERVER_TEXT, FhirServerError, server_text
from medtpe.batch.ndjson_lines import MAX_JSON_DEPTH
from medtpe.batch.smart_backend import ClientKey, public_jwks
from medtpe.batch.write_back import (
    FHIR_JSON,
    MAX_RESPONSE_BYTES,
    WRITE_BACK_SCOPE,
    WriteBackError,
    WriteBackResult,
    write_back,
)
from medtpe.fhir_resources.bundles import (
    PREDICTION_ID_SYSTEM,
    WrittenPrediction,
    identifier_search,
    transaction_bundle,
)
from tests.batch.test_fhir_write_back import CLIENT, FAST, MODEL, predictions
from tests.support.bulk_server import pem, server_access
from tests.support.hostile_fhir import Answer, HostileFhir, hostile_fhir
from tests.support.properties import examples
from tests.support.transaction_server import (
    TransactionServer,
    search_tokens,
    serving_transactions,
)

ANSWER_S = 1.0
"""The tests' deadline on one answer."""
JSON_HEADERS = {"Content-Type": FHIR_JSON}


@pytest.fixture
def hostile() -> Iterator[HostileFhir]:
    with hostile_fhir() as server:
        yield server


def _write(server: HostileFhir, answer_s: float = ANSWER_S) -> WriteBackResult:
    """Two predictions written to `server` (an open server: no token)."""
    return write_back(
        ServerAccess(server.url), predictions(2), MODEL, settings=FAST, answer_s=answer_s
    )


def _eventually(condition: Callable[[], bool], within_s: float = 5.0) -> bool:
    end = time.monotonic() + within_s
    while not condition() and time.monotonic() < end:
        time.sleep(0.02)
    return condition()


def test_an_answer_dripped_forever_is_given_up_at_the_deadline(hostile: HostileFhir) -> None:
    # a byte every 20 ms: no read timeout ever fires
    hostile.answer_all(Answer(200, b" ", JSON_HEADERS, repeat=10**7, pause_s=0.02))
    start = time.monotonic()
    bound = rf"the transaction: {re.escape(hostile.url)} sent no whole answer within 1 s"
    with pytest.raises(FhirServerError, match=bound):
        _write(hostile)
    assert ANSWER_S <= time.monotonic() - start < ANSWER_S + 2
    assert _eventually(lambda: hostile.broken)  # the reading stopped: the connection is closed


def test_an_endless_answer_is_cut_at_the_byte_cap(hostile: HostileFhir) -> None:
    hostile.answer_all(Answer(200, b" " * 65_536, JSON_HEADERS, repeat=10**6))
    bound = rf"{re.escape(hostile.url)}: a response over {MAX_RESPONSE_BYTES} bytes"
    with pytest.raises(FhirServerError, match=bound):
        _write(hostile, answer_s=300)  # time enough for the 16 MiB on a busy machine
    assert _eventually(lambda: hostile.broken)
    assert hostile.sent < MAX_RESPONSE_BYTES + 8 * 1024 * 1024


@pytest.mark.parametrize("status", [200, 500])
def test_json_nested_100000_deep_is_refused_before_the_parser(
    hostile: HostileFhir, status: int
) -> None:
    hostile.answer_all(Answer(status, b"[" * 100_000 + b"]" * 100_000, JSON_HEADERS))
    if status == 200:
        bound = rf"{re.escape(hostile.url)}: the response nests deeper than {MAX_JSON_DEPTH} levels"
        with pytest.raises(FhirServerError, match=bound):
            _write(hostile)
    else:  # an error's body is read for its explanation (and whether it is transient)
        with pytest.raises(WriteBackError, match=r"HTTP 500: Internal Server Error$"):
            _write(hostile)


FORGED = "\x1b[2J\x1b[31mEHR down\r\n2026-11-27 INFO write-back: all written\u202e\x07"
"""An error's text that clears a terminal, colours it, forges a log line and reverses the text."""


def test_an_errors_text_is_shown_on_one_line_without_control_characters_and_cut(
    hostile: HostileFhir,
) -> None:
    outcome = {
        "resourceType": "OperationOutcome",
        "issue": [{"severity": "error", "code": "exception", "diagnostics": FORGED + "x" * 2**21}],
    }
    hostile.answer_all(Answer.json(outcome, status=500))
    with pytest.raises(WriteBackError) as refused:
        _write(hostile)
    message = str(refused.value)
    prefix = f"the FHIR server {hostile.url} refused the transaction: HTTP 500: "
    shown = message.removeprefix(prefix)
    assert shown.startswith("error: exception: [2J [31mEHR down 2026-11-27 INFO write-back: all")
    assert len(shown) == MAX_SERVER_TEXT and shown.endswith("x…")
    assert message.isprintable()
    # 2 MB of text that is no JSON: the status's own words
    hostile.answer_all(Answer(502, FORGED.encode() * 100_000, {"Content-Type": "text/plain"}))
    with pytest.raises(WriteBackError, match=r"HTTP 502: Bad Gateway$"):
        _write(hostile)


@settings(max_examples=examples(200), deadline=None)
@given(st.text(), st.integers(1, 80))
def test_server_text_is_printable_and_bounded(text: str, limit: int) -> None:
    shown = server_text(text, limit)
    assert shown.isprintable() and len(shown) <= limit
    if text.isprintable() and " " not in text and len(text) <= limit:
        assert shown == text


# --- If-None-Exist -----------------------------------------------------------------------------

DELIMITERS = ("a,b", "a|b", "a\\b", "a$b", "a&identifier=b", "a+b c", "a%2Cb", "a#b", "\\,|$&")
"""Identifier values holding a character FHIR search or a URL query gives a meaning."""


@pytest.mark.parametrize(
    ("value", "query"),
    [
        ("a,b", "a%5C%2Cb"),
        ("a|b", "a%5C%7Cb"),
        ("a\\b", "a%5C%5Cb"),
        ("a$b", "a%5C%24b"),
        ("a&identifier=b", "a%26identifier%3Db"),
        ("a+b c", "a%2Bb%20c"),
    ],
)
def test_if_none_exist_escapes_fhir_search_delimiters_and_encodes_the_query(
    value: str, query: str
) -> None:
    header = identifier_search(PREDICTION_ID_SYSTEM, value)
    assert header == f"identifier={PREDICTION_ID_SYSTEM}|{query}"
    name, _, token = header.partition("=")
    assert name == "identifier"
    assert search_tokens(unquote_plus(token)) == [(PREDICTION_ID_SYSTEM, value)]


def test_the_ids_the_product_writes_give_the_header_they_always_had() -> None:
    ids = [str(uuid.UUID(int=k, version=4)) for k in (1, 2**100)] + ["0f" * 16, "pred-x_1.2"]
    items = [replace(item, prediction_id=i) for item, i in zip(predictions(4), ids, strict=True)]
    bundle = transaction_bundle(items, MODEL)
    conditional = [entry for entry in bundle["entry"] if entry["request"]["method"] == "POST"]
    assert len(conditional) == 2 + len(ids)  # the Device, the card, each RiskAssessment
    for entry in conditional:
        (identifier,) = entry["resource"]["identifier"]
        before = f"identifier={identifier['system']}|{identifier['value']}"
        assert entry["request"]["ifNoneExist"] == before


@pytest.fixture
def server() -> Iterator[tuple[TransactionServer, ClientKey]]:
    key = ClientKey.from_pem(pem(ec.generate_private_key(ec.SECP384R1())))
    fhir = TransactionServer({}, clients={CLIENT: public_jwks(key)})
    with serving_transactions(fhir) as served:
        yield served, key


def test_a_conditional_create_finds_exactly_the_identifier_written(
    server: tuple[TransactionServer, ClientKey], tmp_path: Path
) -> None:
    fhir, key = server
    access = replace(server_access(fhir, CLIENT, key, tmp_path), scope=WRITE_BACK_SCOPE)
    decoys = ("a", "b", "identifier=b")
    values = [*decoys, *DELIMITERS]
    items: list[WrittenPrediction] = [
        replace(item, prediction_id=value)
        for item, value in zip(predictions(len(values)), values, strict=True)
    ]
    first = write_back(access, items[: len(decoys)], MODEL, settings=FAST)
    assert first.created["RiskAssessment"] == len(decoys)
    # unescaped, `a,b` would find `a`, `a|b` `b`, `a&identifier=b` both `a` and `b`
    second = write_back(access, items, MODEL, settings=FAST)
    assert second.created["RiskAssessment"] == len(DELIMITERS)
    assert second.existing["RiskAssessment"] == len(decoys)
    written = [r["identifier"][0]["value"] for r in fhir.of_type("RiskAssessment")]
    assert sorted(written) == sorted(values)
    again = write_back(access, items, MODEL, settings=FAST)  # a rerun creates nothing
    assert dict(again.created) == {} and again.existing["RiskAssessment"] == len(values)
