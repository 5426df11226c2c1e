"""A ledger row edited in the database, behind the ledger's back, is caught by `medtpe verify`
(`--signature-only`, through the command line): every column of the `predictions` table that a
receipt signs — who asked, through which door, for which site, about whom, as of when, whether it
was shown, and the answer — is compared with the receipt, and an edit names its column, on SQLite
for each column and on PostgreSQL too. A column no receipt signs (the token counts, the latency,
whether the answer parsed) is caught by the row's link in the ledger's hash chain, which covers
every column. A version 1 receipt (written before receipts signed who, when and whether shown)
still verifies for what it signs, verify names the columns it does not sign, and the chain still
catches an edit of them."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import update

from medtpe.cli.main import cli
from medtpe.ledger.receipt import PREDICTION_FIELDS, Receipt
from medtpe.ledger.schema import Prediction
from medtpe.ledger.store import Ledger, PredictionRow
from medtpe.ledger.verification import signed_columns
from tests.support.ledger_rows import SIGNER, row

TABLE = Prediction.__table__
SIGNED = row(1)
"""A `/predict` row for tenant-a, about subject 7 as of 2020-01-02, answered "yes", shown."""
EDITS: dict[str, Any] = {
    "prediction_id": str(uuid.UUID(int=99, version=4)),
    "created_at": SIGNED.created_at.replace(tzinfo=None) + timedelta(seconds=1),
    "door": "cds_hook",
    "caller": "key:someone-else",
    "site": "tenant-b",
    "task": "readmission_30d",
    "subject_id": "11",
    "prediction_time": datetime(2020, 1, 3),
    "mode": "original",
    "answer": '"no"',
    "p_yes": 0.01,
    "silent": True,
}
"""For each signed column, another value an edit in the database could give it (times as the
ledger stores them: naive UTC)."""


def test_every_column_that_says_who_when_or_whether_shown_is_signed() -> None:
    columns = signed_columns(Receipt.from_text(SIGNED.receipt))
    assert set(columns) == set(EDITS)
    assert set(PREDICTION_FIELDS) <= set(columns) <= set(TABLE.columns.keys())


def verify(url: str, prediction_id: str, key: Path) -> Result:
    """`medtpe verify PREDICTION_ID --signature-only` on the ledger at `url`."""
    arguments = ["verify", prediction_id, "--ledger", url, "--signature-only", "--public-key"]
    return CliRunner().invoke(cli, [*arguments, str(key)])


def edited(url: str, signed: PredictionRow, changes: dict[str, Any]) -> str:
    """Record `signed`, then change its `changes` columns with an UPDATE; the row's id after."""
    ledger = Ledger.open(url)
    try:
        ledger.record([signed])
        if changes:
            with ledger.engine.begin() as connection:
                statement = update(TABLE).where(TABLE.c.prediction_id == signed.prediction_id)
                connection.execute(statement.values(changes))
    finally:
        ledger.close()
    return changes.get("prediction_id", signed.prediction_id)


@pytest.fixture
def key(tmp_path: Path) -> Path:
    """The signer's public key as a JWK file."""
    path = tmp_path / "key.jwk"
    path.write_text(json.dumps(SIGNER.jwk()))
    return path


@pytest.mark.parametrize("column", sorted(EDITS))
def test_an_edit_of_a_signed_column_in_the_database_is_named(
    column: str, tmp_path: Path, key: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    result = verify(url, edited(url, SIGNED, {column: EDITS[column]}), key)
    assert result.exit_code == 1, result.output
    assert "ok   signature" in result.output
    assert f"DIFF row       row edited: {column} differ from the signed receipt" in result.output


def test_an_edit_of_whom_and_whether_shown_is_named_on_every_database(
    ledger_url: str, key: Path
) -> None:
    untouched = verify(ledger_url, edited(ledger_url, row(2), {}), key)
    assert untouched.exit_code == 0, untouched.output
    assert "the row's 12 signed columns say what its receipt signs" in untouched.output
    changes = {"subject_id": "11", "silent": True, "prediction_time": datetime(2020, 1, 3)}
    result = verify(ledger_url, edited(ledger_url, SIGNED, changes), key)
    assert result.exit_code == 1, result.output
    assert "row edited: prediction_time, silent, subject_id differ" in result.output


def test_a_version_1_receipt_verifies_for_what_it_signs_and_names_what_it_does_not(
    tmp_path: Path, key: Path
) -> None:
    current = Receipt.from_text(SIGNED.receipt)
    old = dataclasses.replace(current, receipt_version=1, **dict.fromkeys(PREDICTION_FIELDS))
    assert json.loads(old.canonical()).keys() == json.loads(SIGNED.receipt).keys() - set(
        PREDICTION_FIELDS
    )
    written = dataclasses.replace(
        SIGNED, receipt=old.canonical().decode(), signature=SIGNER.sign(old)
    )
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    result = verify(url, edited(url, written, {"subject_id": "11"}), key)
    assert result.exit_code == 1, result.output  # the chain covers the column the receipt does not
    assert "DIFF chain" in result.output
    assert "ok   signature" in result.output
    assert "ok   row       the row's 6 signed columns say what its receipt signs" in result.output
    assert (
        "ok   coverage  receipt version 1 does not sign subject_id, prediction_time, door, "
        "caller, site, silent: those columns are not checked"
    ) in result.output
    answered = dataclasses.replace(written, prediction_id=str(uuid.uuid4()))
    old_answered = dataclasses.replace(old, prediction_id=answered.prediction_id)
    answered = dataclasses.replace(
        answered, receipt=old_answered.canonical().decode(), signature=SIGNER.sign(old_answered)
    )
    result = verify(url, edited(url, answered, {"answer": '"no"'}), key)
    assert result.exit_code == 1 and "row edited: answer differ" in result.output


UNSIGNED_EDITS: dict[str, Any] = {
    "format_ok": False,
    "original_tokens": 1,
    "medtpe_tokens": 1,
    "compression_rate": 0.99,
    "latency_ms": 0.5,
}
"""Columns no receipt signs, and another value an edit could give each."""


@pytest.mark.parametrize("column", sorted(UNSIGNED_EDITS))
def test_an_edit_of_a_column_no_receipt_signs_is_caught_by_the_chain(
    column: str, tmp_path: Path, key: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    untouched = verify(url, edited(url, row(3), {}), key)
    assert untouched.exit_code == 0, untouched.output
    assert "ok   chain" in untouched.output
    result = verify(url, edited(url, SIGNED, {column: UNSIGNED_EDITS[column]}), key)
    assert result.exit_code == 1, result.output
    assert "ok   row" in result.output
    assert "DIFF chain     row edited: a column differs from the chain's digest" in result.output
