"""An answer's receipt basis (`medtpe.ledger.answers.ReceiptBasis`): a fixed answer gives the
pinned version 2 receipt, byte for byte, and the row every release gave; a version 1 receipt
(pinned as those releases wrote it) still reads back to its own bytes and verifies for what it
signs, naming the columns it does not; the basis survives the score cache's JSON exactly, and a
malformed one is refused by name."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from medtpe.core.answer_facts import AnswerFacts, RenderingFacts
from medtpe.ledger.answers import ReceiptBasis
from medtpe.ledger.receipt import Receipt, utc_text
from medtpe.ledger.signing import verify_signature
from medtpe.ledger.verification import check_row
from tests.support.ledger_rows import DECODING, SIGNER, events

PREDICTION_ID = "00000000-0000-4000-8000-000000000001"
CREATED_AT = "2026-01-01T00:00:00.000000Z"
FACTS = AnswerFacts(
    task="icu_mortality",
    subject_id="7",
    events=events(),
    prediction_time=datetime(2020, 1, 2),
    descriptions={"LAB//50912": "Creatinine"},
    prompt_ids=[5, 3, 9, 1],
    artefact_digest="a" * 64,
    rendering=RenderingFacts(
        render_version=1,
        descriptions_sha256="b" * 64,
        max_input_tokens=4096,
        window_policy="sliding",
        window_grid_hours=24,
        prompt_layout="task-first.v1",  # the layout receipts that name none were made in
        shell_tokens=None,
    ),
    model="smollm2-135m-instruct",
    mode="medtpe",
    dtype="float32",
    decoding=DECODING,
    engine_version="InstantEngine/vllm-none",
    product_version="0.1.0",
    answer="yes",
    p_yes=0.8125,
    format_ok=True,
    original_tokens=900,
    medtpe_tokens=600,
    compression_rate=1 / 3,
    latency_ms=12.5,
)
RECORD = (
    '{"descriptions":{"LAB//50912":"Creatinine"},"events":[[null,"GENDER//F",null,null],'
    '["2020-01-01T08:00:00.000000","LAB//50912",1.1,null],'
    '["2020-01-01T09:30:00.250000","LAB//50912",0.30000000000000004,null]],'
    '"prediction_time":"2020-01-02T00:00:00.000000","subject_id":7}'
)
CANONICAL_RECEIPT = (
    '{"answer":"yes","artefact_digest":"' + "a" * 64 + '","caller":"key:x",'
    '"created_at":"' + CREATED_AT + '",'
    '"decoding":{"constrained":false,"max_new_tokens":64,"n_samples":1,"probabilities":true,'
    '"seed":null,"temperature":0.0},"door":"predict","dtype":"float32",'
    '"engine_version":"InstantEngine/vllm-none",'
    '"mode":"medtpe","model":"smollm2-135m-instruct","p_yes":0.8125,'
    '"prediction_id":"' + PREDICTION_ID + '","prediction_time":"2020-01-02T00:00:00.000000Z",'
    '"product_version":"0.1.0",'
    '"prompt_ids_sha256":"9e33b57fc8dc3e308e2d43eb4d2ebdebbb94715180182d6412deff5031af2148",'
    '"receipt_version":2,'
    '"record_sha256":"1c98f81078b6be764277fe4f2c318aba02ca8d8179fb3b37f80f6127501a2ec5",'
    '"rendering":{"descriptions_sha256":"' + "b" * 64 + '","max_input_tokens":4096,'
    '"render_version":1,"window_grid_hours":24,"window_policy":"sliding"},'
    '"rendering_digest":"e224de18d053c04a3c9e8038aee6501628ae5ab0693a4c69020761e9360332e7",'
    '"silent":false,"site":null,"subject_id":"7","task":"icu_mortality"}'
)
"""The version 2 receipt of `FACTS` asked through `/predict` by `key:x` (created_at set to
CREATED_AT)."""
CANONICAL_RECEIPT_V1 = (
    '{"answer":"yes","artefact_digest":"' + "a" * 64 + '","created_at":"' + CREATED_AT + '",'
    '"decoding":{"constrained":false,"max_new_tokens":64,"n_samples":1,"probabilities":true,'
    '"seed":null,"temperature":0.0},"dtype":"float32","engine_version":"InstantEngine/vllm-none",'
    '"mode":"medtpe","model":"smollm2-135m-instruct","p_yes":0.8125,'
    '"prediction_id":"' + PREDICTION_ID + '","product_version":"0.1.0",'
    '"prompt_ids_sha256":"9e33b57fc8dc3e308e2d43eb4d2ebdebbb94715180182d6412deff5031af2148",'
    '"receipt_version":1,'
    '"record_sha256":"1c98f81078b6be764277fe4f2c318aba02ca8d8179fb3b37f80f6127501a2ec5",'
    '"rendering":{"descriptions_sha256":"' + "b" * 64 + '","max_input_tokens":4096,'
    '"render_version":1,"window_grid_hours":24,"window_policy":"sliding"},'
    '"rendering_digest":"e224de18d053c04a3c9e8038aee6501628ae5ab0693a4c69020761e9360332e7",'
    '"task":"icu_mortality"}'
)
"""The version 1 receipt of `FACTS` as the releases before version 2 wrote it (created_at set
to CREATED_AT): it signs no subject, prediction time, door, caller, site or silent."""


def test_a_fixed_answer_gives_the_version_2_receipt_and_the_row_it_always_gave() -> None:
    before = datetime.now(UTC)
    row = ReceiptBasis.of(FACTS, keep_record=True).signed(
        SIGNER, door="predict", caller="key:x", prediction_id=PREDICTION_ID
    )
    receipt = Receipt.from_text(row.receipt)
    assert verify_signature(receipt, row.signature, SIGNER.public_key)
    assert before - timedelta(seconds=1) <= row.created_at <= datetime.now(UTC)
    assert receipt.created_at == utc_text(row.created_at)
    pinned = dataclasses.replace(receipt, created_at=CREATED_AT).canonical()
    assert pinned.decode() == CANONICAL_RECEIPT
    columns = row.values()
    for name in ("created_at", "receipt", "signature"):
        del columns[name]
    assert columns == {
        "prediction_id": PREDICTION_ID,
        "door": "predict",
        "caller": "key:x",
        "site": None,
        "task": "icu_mortality",
        "subject_id": "7",
        "prediction_time": datetime(2020, 1, 2),
        "answer": '"yes"',
        "p_yes": 0.8125,
        "format_ok": True,
        "original_tokens": 900,
        "medtpe_tokens": 600,
        "compression_rate": 1 / 3,
        "latency_ms": 12.5,
        "mode": "medtpe",
        "key_id": SIGNER.key_id,
        "record": RECORD,
        "silent": False,
        "shadow_of": None,
    }


def test_a_record_first_receipt_signs_its_layout_and_text_reserve() -> None:
    rendering = dataclasses.replace(
        FACTS.rendering, prompt_layout="record-first.v1", shell_tokens=412
    )
    basis = ReceiptBasis.of(dataclasses.replace(FACTS, rendering=rendering))
    assert basis.rendering == {
        **ReceiptBasis.of(FACTS).rendering,
        "prompt_layout": "record-first.v1",
        "shell_tokens": 412,
    }
    assert basis.rendering_digest != ReceiptBasis.of(FACTS).rendering_digest
    row = basis.signed(SIGNER, door="predict", caller="key:x", prediction_id=PREDICTION_ID)
    assert Receipt.from_text(row.receipt).rendering["shell_tokens"] == 412


def test_a_version_1_receipt_still_verifies_for_what_it_signs() -> None:
    old = Receipt.from_text(CANONICAL_RECEIPT_V1)
    assert old.canonical().decode() == CANONICAL_RECEIPT_V1  # the bytes its signature covers
    assert set(old.to_json()) == set(json.loads(CANONICAL_RECEIPT_V1))
    current = ReceiptBasis.of(FACTS).signed(
        SIGNER, door="predict", caller="key:x", prediction_id=PREDICTION_ID
    )
    row = dataclasses.replace(
        current,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        receipt=CANONICAL_RECEIPT_V1,
        signature=SIGNER.sign(old),
    )
    receipt, checks = check_row(row, SIGNER.public_key)
    assert receipt == old
    assert [(c.part, c.ok) for c in checks] == [
        ("signature", True),
        ("row", True),
        ("coverage", True),
    ]
    assert checks[1].detail == "the row's 6 signed columns say what its receipt signs"
    assert checks[2].detail == (
        "receipt version 1 does not sign subject_id, prediction_time, door, caller, site, "
        "silent: those columns are not checked"
    )
    _, checks = check_row(dataclasses.replace(row, p_yes=0.5), SIGNER.public_key)
    assert checks[1].detail == "row edited: p_yes differ from the signed receipt"
    assert check_row(current, SIGNER.public_key)[1][1].detail == (
        "the row's 12 signed columns say what its receipt signs"
    )


def test_a_row_says_how_it_was_asked_and_keeps_the_record_only_when_told() -> None:
    basis = ReceiptBasis.of(dataclasses.replace(FACTS, prediction_time=None))
    row = basis.signed(
        SIGNER,
        door="cds_hook",
        caller="issuer tenant=-",
        site="svc",
        latency_ms=3.5,
        silent=True,
        shadow_of=PREDICTION_ID,
    )
    assert (row.door, row.caller, row.site, row.silent, row.shadow_of) == (
        "cds_hook",
        "issuer tenant=-",
        "svc",
        True,
        PREDICTION_ID,
    )
    assert (row.latency_ms, row.record, row.prediction_time) == (3.5, None, None)
    assert row.prediction_id != basis.signed(SIGNER, door="predict", caller="x").prediction_id


def test_the_basis_survives_the_score_caches_json_exactly() -> None:
    basis = ReceiptBasis.of(FACTS, keep_record=True)
    data = basis.to_json()
    assert set(data) == {"receipt", "row"}
    assert set(data["row"]) == {
        "subject_id", "prediction_time", "format_ok", "original_tokens", "medtpe_tokens",
        "compression_rate", "latency_ms", "record",
    }  # fmt: skip
    for encode, decode in ((json.dumps, json.loads), (msgspec.json.encode, msgspec.json.decode)):
        assert ReceiptBasis.from_json(decode(encode(data))) == basis
    signed_since = {  # a figure a later release signs reads the same from either part
        "receipt": data["receipt"] | {"subject_id": "7"},
        "row": {k: v for k, v in data["row"].items() if k != "subject_id"},
    }
    assert ReceiptBasis.from_json(signed_since) == basis


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: {"receipt": d["receipt"]}, "no 'row' part"),
        (lambda d: d | {"row": d["row"] | {"extra": 1}}, "extra"),
        (lambda d: d | {"row": {k: v for k, v in d["row"].items() if k != "record"}}, "record"),
        (lambda d: d | {"receipt": d["receipt"] | {"record": None}}, "multiple values"),
    ],
)
def test_a_malformed_basis_is_refused_by_name(change: Callable[[Any], Any], message: str) -> None:
    data = ReceiptBasis.of(FACTS).to_json()
    with pytest.raises(ValueError, match=f"receipt basis: .*{message}"):
        ReceiptBasis.from_json(change(data))
