"""Receipts: the canonical record and receipt bytes, the Ed25519 signature (a forged or edited
receipt fails), the key's JWK and thumbprint (RFC 8037's example key), where the key comes
from."""

from __future__ import annotations

import base64
import dataclasses
import json
import stat
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from medtpe.core.meds import SubjectEvents
from medtpe.core.meds.canonical import canonical_record, parse_canonical_record, record_digest
from medtpe.ledger.receipt import Receipt, prompt_ids_digest, utc_text
from medtpe.ledger.signing import (
    Signer,
    SigningKeyError,
    parse_private_key,
    public_key_from_jwk,
    signer_for,
    verify_signature,
)
from tests.support.ledger_rows import (
    RFC8037_SEED_B64,
    RFC8037_THUMBPRINT,
    SIGNER,
    events,
    receipt,
    row,
)


def test_the_canonical_record_is_the_events_the_prediction_may_read() -> None:
    canonical = canonical_record(events(), datetime(2020, 1, 2, 0, 0))
    document = json.loads(canonical)
    assert (
        canonical
        == json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    )
    assert document["events"] == [
        [None, "GENDER//F", None, None],
        ["2020-01-01T08:00:00.000000", "LAB//50912", 1.1, None],
        ["2020-01-01T09:30:00.250000", "LAB//50912", 0.30000000000000004, None],
    ]  # the note after the prediction time is not read; 0.1 + 0.2 kept to the last bit
    assert document["prediction_time"] == "2020-01-02T00:00:00.000000"
    assert b"caf\xc3\xa9" in canonical_record(events(), None)
    assert (document["subject_id"], document["descriptions"]) == (7, {})


def test_equal_records_digest_equal_and_any_change_differs() -> None:
    when = datetime(2020, 1, 2, 0, 0)
    digest = record_digest(events(), when)
    same_instant = datetime(2020, 1, 2, 1, 0, tzinfo=timezone(timedelta(hours=1)))
    assert record_digest(events(), same_instant) == digest
    base = events()
    changed = dataclasses.replace(
        base, numeric_values=base.numeric_values + np.array([0, 0, 1e-15, 0])
    )
    others = [
        (changed, when),
        (events(subject_id=8), when),
        (events(), when + timedelta(hours=9)),  # the note is read now
        (events(), when, {"LAB//50912": "Creatinine"}),
    ]
    assert len({digest, *(record_digest(*other) for other in others)}) == 5
    assert len({canonical_record(*other) for other in others}) == 4


def test_the_canonical_record_reads_back_into_the_same_events() -> None:
    when = datetime(2020, 1, 3)
    read, at, descriptions = parse_canonical_record(canonical_record(events(), when, {"A": "b"}))
    assert isinstance(read, SubjectEvents) and (at, descriptions) == (when, {"A": "b"})
    assert canonical_record(read, at, descriptions) == canonical_record(events(), when, {"A": "b"})
    assert record_digest(read, at, descriptions) == record_digest(events(), when, {"A": "b"})


def test_a_signed_receipt_verifies_and_an_edited_or_forged_one_does_not() -> None:
    made = receipt(1)
    signature = SIGNER.sign(made)
    assert verify_signature(made, signature, SIGNER.public_key)
    for change in (
        {"answer": "no"},
        {"p_yes": made.p_yes + 1e-12},
        {"artefact_digest": "0" * 64},
        {"decoding": made.decoding | {"temperature": 0.7}},
    ):
        assert not verify_signature(
            dataclasses.replace(made, **change), signature, SIGNER.public_key
        )
    forger = Signer(Ed25519PrivateKey.generate())
    assert not verify_signature(made, forger.sign(made), SIGNER.public_key)
    assert not verify_signature(made, "not-base64!", SIGNER.public_key)


def test_a_receipt_reads_back_from_its_canonical_text() -> None:
    made = receipt(2)
    assert Receipt.from_text(made.canonical()) == made
    assert row(2).receipt == made.canonical().decode()
    with pytest.raises(ValueError, match="unknown fields"):
        Receipt.from_json(made.to_json() | {"extra": 1})
    with pytest.raises(ValueError, match="receipt"):
        Receipt.from_json({"prediction_id": "x"})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"receipt_version": 1}, r"version 1 signs no subject_id, prediction_time, door, caller"),
        ({"door": None}, r"version 2 misses fields \['door'\]"),
        ({"silent": 0}, r"version 2 needs silent \(bool\)"),
        ({"receipt_version": 3}, r"version 3 is none this release reads \(1, 2\)"),
        ({"receipt_version": "2"}, r"version '2' is none this release reads"),
    ],
)
def test_a_receipt_not_of_its_versions_fields_is_refused(
    change: dict[str, object], message: str
) -> None:
    data = {k: v for k, v in (receipt(1).to_json() | change).items() if v is not None}
    data["site"] = None  # a version 2 receipt's site may be null
    with pytest.raises(ValueError, match=f"receipt: {message}"):
        Receipt.from_json(data)


def test_the_prompt_ids_digest_is_of_the_canonical_list() -> None:
    assert prompt_ids_digest([1, 2, 3]) == prompt_ids_digest(np.array([1, 2, 3]).tolist())
    assert prompt_ids_digest([1, 2, 3]) != prompt_ids_digest([1, 2, 3, 0])
    assert utc_text(datetime(2026, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))) == (
        "2026-01-01T00:00:00.000000Z"
    )


def test_the_public_jwk_and_its_thumbprint_are_rfc_8037s() -> None:
    signer = Signer(parse_private_key(RFC8037_SEED_B64))
    jwk = signer.jwk()
    assert jwk["x"] == "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
    assert jwk["kid"] == signer.key_id == RFC8037_THUMBPRINT
    assert verify_signature(receipt(), signer.sign(receipt()), public_key_from_jwk(jwk))
    with pytest.raises(SigningKeyError, match="Ed25519"):
        public_key_from_jwk({"kty": "RSA"})


def test_the_key_is_read_from_pem_or_a_base64_seed_and_refused_otherwise() -> None:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    assert Signer(parse_private_key(pem)).key_id == Signer(key).key_id
    with pytest.raises(SigningKeyError, match="16 bytes"):
        parse_private_key(base64.b64encode(b"x" * 16).decode())
    with pytest.raises(SigningKeyError, match="neither PEM nor base64"):
        parse_private_key("not a key")


def test_a_local_sqlite_ledger_keeps_a_generated_key_and_a_shared_one_needs_the_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key_file = tmp_path / "cache" / "ledger-signing-key"
    first = signer_for("sqlite:///x.sqlite3", None, key_file)
    assert "MEDTPE_LEDGER_SIGNING_KEY" in caplog.text
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert signer_for("sqlite:///x.sqlite3", None, key_file).key_id == first.key_id
    with pytest.raises(SigningKeyError, match="required"):
        signer_for("postgresql://db/ledger", None, key_file)
    configured = signer_for("postgresql://db/ledger", RFC8037_SEED_B64, key_file)
    assert configured.key_id == RFC8037_THUMBPRINT


def test_a_row_carries_what_its_receipt_signs() -> None:
    made = row(3)
    signed = Receipt.from_text(made.receipt)
    assert (made.prediction_id, made.task, made.mode, made.p_yes) == (
        signed.prediction_id,
        signed.task,
        signed.mode,
        signed.p_yes,
    )
    assert json.loads(made.answer) == signed.answer
    assert made.created_at == datetime.fromisoformat(signed.created_at.removesuffix("Z")).replace(
        tzinfo=UTC
    )
    assert verify_signature(signed, made.signature, SIGNER.public_key)
    assert made.key_id == SIGNER.key_id
