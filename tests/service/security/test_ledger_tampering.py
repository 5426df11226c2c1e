"""`medtpe ledger audit` against a ledger changed behind its back, on SQLite and on a real
PostgreSQL: a row deleted, a forged row inserted (without a place, or in one), two rows swapped,
a column edited, the chain recomputed after a deletion, the last rows deleted with the ledger's
checkpoints (caught by the checkpoints kept elsewhere only), a forged checkpoint; each is named
in one line with exit status 1, an intact ledger gives exit status 0."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Connection, select, text

from medtpe.cli.main import cli
from medtpe.ledger.chain import GENESIS, Checkpoint, Head, link, row_digest
from medtpe.ledger.receipt import Receipt
from medtpe.ledger.schema import Prediction
from medtpe.ledger.signing import Signer
from medtpe.ledger.store import Ledger
from tests.support.ledger_rows import SIGNER, row

ROWS = 12
OTHER = Signer(Ed25519PrivateKey.generate())
_TABLE = Prediction.__table__


@pytest.fixture
def kept(tmp_path: Path) -> Path:
    """Where the operator keeps the checkpoints, away from the ledger."""
    return tmp_path / "checkpoints.jsonl"


@pytest.fixture
def ledger(ledger_url: str, kept: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    """A ledger of 12 rows written in five transactions, checkpointed at rows 5 and 10 as they
    were written and at row 12 by `medtpe ledger checkpoint --out`; the CLI on it, its key
    `SIGNER`'s."""
    seed = SIGNER.private_key.private_bytes_raw()
    monkeypatch.setenv("MEDTPE_LEDGER_URL", ledger_url)
    monkeypatch.setenv("MEDTPE_LEDGER_SIGNING_KEY", base64.b64encode(seed).decode())
    opened = Ledger.open(ledger_url, checkpoint_every=5, signer=lambda: SIGNER)
    for span in ((0,), (1, 2, 3), (4, 5, 6, 7), (8,), (9, 10, 11)):
        opened.record([row(i) for i in span])
    made = CliRunner().invoke(cli, ["ledger", "checkpoint", "--out", str(kept)])
    assert made.exit_code == 0, made.output
    assert Checkpoint.from_line(made.output.strip()).rows == ROWS
    assert kept.read_text() == made.output
    return opened


def run_audit(*args: str) -> Result:
    """`medtpe ledger audit` with `args`."""
    return CliRunner().invoke(cli, ["ledger", "audit", *args])


def tamper(ledger: Ledger, change: Callable[[Connection], None]) -> None:
    """Change the ledger's database behind the ledger's back."""
    with ledger.engine.begin() as connection:
        change(connection)


def execute(*statements: str) -> Callable[[Connection], None]:
    """A change of plain SQL statements."""

    def change(connection: Connection) -> None:
        for statement in statements:
            connection.execute(text(statement))

    return change


def renumber_from(place: int) -> tuple[str, str]:
    """Statements that make room at `place`: every row from it one place later."""
    return (
        f"UPDATE predictions SET chain_seq = -chain_seq WHERE chain_seq >= {place}",
        "UPDATE predictions SET chain_seq = 1 - chain_seq WHERE chain_seq < 0",
    )


def forged_row(index: int) -> dict[str, object]:
    """A row whose receipt is signed by another key."""
    made = row(index)
    receipt = Receipt.from_text(made.receipt)
    forged = dataclasses.replace(made, signature=OTHER.sign(receipt), key_id=OTHER.key_id)
    return forged.values() | {"record": None}


def digest_at(connection: Connection, place: int) -> str:
    found = select(_TABLE.c.chain_digest).where(_TABLE.c.chain_seq == place)
    return connection.execute(found).scalar_one()


def test_an_intact_ledger_passes(ledger: Ledger, kept: Path) -> None:
    done = run_audit("--checkpoints", str(kept))
    assert done.exit_code == 0, done.output
    assert done.output.startswith(f"{ROWS} rows, chain intact, last checkpoint at row {ROWS}")
    assert f"(the ledger, {kept})" in done.output
    assert len(done.output.splitlines()) == 1


def test_a_deleted_row_is_a_gap(ledger: Ledger) -> None:
    tamper(ledger, execute("DELETE FROM predictions WHERE chain_seq = 6"))
    done = run_audit()
    assert done.exit_code == 1
    assert done.output == (
        f"gap: row 6 of the chain missing before prediction {row(6).prediction_id} (row 7): "
        "deleted\n"
    )


def test_a_forged_row_without_a_place_is_an_insertion(ledger: Ledger) -> None:
    tamper(ledger, lambda connection: connection.execute(_TABLE.insert(), forged_row(50)))
    done = run_audit()
    assert done.exit_code == 1
    assert done.output.startswith(f"insertion: prediction {row(50).prediction_id} has no place")


def test_a_forged_row_given_a_place_is_an_insertion(ledger: Ledger) -> None:
    def insert(connection: Connection) -> None:
        execute(*renumber_from(4))(connection)
        connection.execute(
            _TABLE.insert(), forged_row(51) | {"chain_seq": 4, "chain_digest": GENESIS}
        )

    tamper(ledger, insert)
    done = run_audit()
    assert done.exit_code == 1
    assert done.output == (
        f"insertion: prediction {row(51).prediction_id} (row 4) was not chained there: the row "
        "after it is chained to the row before it\n"
    )


def test_a_forged_row_with_its_link_computed_is_an_insertion(ledger: Ledger) -> None:
    def insert(connection: Connection) -> None:
        previous = digest_at(connection, 3)
        execute(*renumber_from(4))(connection)
        values = forged_row(52)
        digest = link(previous, row_digest(values))
        connection.execute(_TABLE.insert(), values | {"chain_seq": 4, "chain_digest": digest})

    tamper(ledger, insert)
    done = run_audit()
    assert done.exit_code == 1
    assert done.output.startswith(
        f"insertion: prediction {row(52).prediction_id} (row 4) was not chained there: "
        "signature invalid"
    )


@pytest.mark.parametrize("places", [(5, 6), (3, 9)])
def test_two_rows_swapped_are_a_reordering(ledger: Ledger, places: tuple[int, int]) -> None:
    first, second = places
    tamper(
        ledger,
        execute(
            f"UPDATE predictions SET chain_seq = -1 WHERE chain_seq = {first}",
            f"UPDATE predictions SET chain_seq = {first} WHERE chain_seq = {second}",
            f"UPDATE predictions SET chain_seq = {second} WHERE chain_seq = -1",
        ),
    )
    done = run_audit()
    assert done.exit_code == 1
    moved, before = row(second - 1).prediction_id, row(second - 2).prediction_id
    now = second if second == first + 1 else second - 1  # where the row it follows is now
    assert done.output == (
        f"reordering: prediction {moved} (row {first}) was chained after prediction {before}, "
        f"which now comes after it (row {now})\n"
    )


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("answer", "'\"yes\"'", "row edited: answer"),
        ("latency_ms", "1.0", "is not what was chained there"),
    ],
)
def test_an_edited_column_is_an_edit(ledger: Ledger, column: str, value: str, says: str) -> None:
    tamper(ledger, execute(f"UPDATE predictions SET {column} = {value} WHERE chain_seq = 7"))
    done = run_audit()
    assert done.exit_code == 1
    assert done.output.startswith(f"edit: prediction {row(6).prediction_id} (row 7)")
    assert says in done.output and len(done.output.splitlines()) == 1


def test_a_chain_recomputed_after_a_deletion_differs_from_its_checkpoint(ledger: Ledger) -> None:
    def delete_and_relink(connection: Connection) -> None:
        connection.execute(text("DELETE FROM predictions WHERE chain_seq = 7"))
        head = Head(6, digest_at(connection, 6))
        later = connection.execute(
            select(_TABLE).where(_TABLE.c.chain_seq > 7).order_by(_TABLE.c.chain_seq)
        ).mappings()
        for values in list(later):
            head = Head(head.rows + 1, link(head.digest, row_digest(values)))
            connection.execute(
                _TABLE.update()
                .where(_TABLE.c.prediction_id == values["prediction_id"])
                .values(chain_seq=head.rows, chain_digest=head.digest)
            )

    tamper(ledger, delete_and_relink)
    done = run_audit()
    assert done.exit_code == 1
    assert done.output.startswith("rewrite: the chain at row 10 is not the one signed")


def test_the_last_rows_deleted_with_the_checkpoints_show_only_against_those_kept(
    ledger: Ledger, kept: Path
) -> None:
    tamper(
        ledger,
        execute("DELETE FROM predictions WHERE chain_seq > 8", "DELETE FROM chain_checkpoints"),
    )
    alone = run_audit()
    assert (alone.exit_code, alone.output) == (0, "8 rows, chain intact, no checkpoint\n")
    done = run_audit("--checkpoints", str(kept))
    assert done.exit_code == 1
    assert done.output.startswith("rollback: the chain ends at row 8 but a checkpoint signed")
    assert f"({kept}) covers 12 rows" in done.output


def test_a_forged_checkpoint_is_named(ledger: Ledger, kept: Path) -> None:
    kept.write_text(Checkpoint.sign(Head(ROWS + 5, GENESIS), OTHER).to_line() + "\n")
    done = run_audit("--checkpoints", str(kept))
    assert done.exit_code == 1
    assert done.output.startswith("forged checkpoint: the checkpoint at row 17")


def test_the_audit_refuses_what_it_cannot_check(ledger: Ledger, kept: Path, tmp_path: Path) -> None:
    kept.write_text(kept.read_text() + "not a checkpoint\n")
    bad = run_audit("--checkpoints", str(kept))
    assert bad.exit_code == 2 and f"{kept}, line 2: no checkpoint" in bad.output
    late = run_audit("--deadline-s", "0.000001")
    assert late.exit_code == 1 and "audit incomplete: its deadline passed" in late.output
    missing = run_audit("--ledger", f"sqlite:///{tmp_path / 'none.sqlite3'}")
    assert missing.exit_code == 2 and "no ledger at" in missing.output
    assert not (tmp_path / "none.sqlite3").exists()


def test_the_oldest_rows_deleted_by_retention_are_named_not_refused(ledger: Ledger) -> None:
    tamper(ledger, execute("DELETE FROM predictions WHERE chain_seq <= 3"))
    done = run_audit()
    assert done.exit_code == 0, done.output
    assert done.output.startswith(
        "9 rows, chain intact over rows 4–12 (those before deleted), last checkpoint at row 12"
    )
