"""The predictions' hash chain on SQLite and on a real PostgreSQL: rows chained in commit order
without gaps (retries and refused conflicts take no place), checkpoints signed every N rows,
four processes writing to one PostgreSQL at once, and a ledger of schema 0002 chained by its
migration."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from sqlalchemy import select

from medtpe.ledger.audit import audit
from medtpe.ledger.chain import GENESIS, Checkpoint, link, row_digest, stored_checkpoints
from medtpe.ledger.migrate import upgrade
from medtpe.ledger.schema import Feedback, Prediction
from medtpe.ledger.settings import DatabaseTimeouts, LedgerSettings
from medtpe.ledger.store import Ledger, LedgerConflict, make_engine
from tests.support.ledger_rows import RFC8037_SEED_B64, SIGNER, START, row
from tests.support.postgres import PostgresServer
from tests.support.server_fixtures import fresh_database

_TABLE = Prediction.__table__


def chain_of(ledger: Ledger) -> list[tuple[int, str, str]]:
    """(place, prediction id, link) of every row, in the chain's order."""
    with ledger.engine.connect() as connection:
        query = select(_TABLE.c.chain_seq, _TABLE.c.prediction_id, _TABLE.c.chain_digest)
        return [tuple(found) for found in connection.execute(query.order_by(_TABLE.c.chain_seq))]


def relinked(ledger: Ledger) -> list[str]:
    """The links recomputed from the rows as stored, in the chain's order."""
    digests, previous = [], GENESIS
    with ledger.engine.connect() as connection:
        for values in connection.execute(select(_TABLE).order_by(_TABLE.c.chain_seq)).mappings():
            previous = link(previous, row_digest(values))
            digests.append(previous)
    return digests


def test_rows_are_chained_in_commit_order_without_gaps(ledger_url: str) -> None:
    ledger = Ledger.open(ledger_url)
    ledger.record([row(3)])
    ledger.record([row(1), row(2)])
    ledger.record([row(2), row(0)])  # a retry of row 2 with a new row: only row 0 is appended
    with pytest.raises(LedgerConflict):
        ledger.record([row(4), row(1, caller="key:other")])  # refused whole: takes no place
    ledger.record([row(5)])
    chain = chain_of(ledger)
    assert [seq for seq, _, _ in chain] == [1, 2, 3, 4, 5]
    order = [3, 1, 2, 0, 5]
    assert [found for _, found, _ in chain] == [row(i).prediction_id for i in order]
    assert [digest for _, _, digest in chain] == relinked(ledger)
    assert ledger.get(row(0).prediction_id) == row(0, record=None)  # the chain's columns unread
    ledger.close()


def test_a_checkpoint_is_signed_every_n_rows(ledger_url: str) -> None:
    ledger = Ledger.open(ledger_url, checkpoint_every=3, signer=lambda: SIGNER)
    ledger.record([row(0), row(1)])
    ledger.record([row(i) for i in range(2, 8)])  # passes rows 3 and 6 in one transaction
    digests = relinked(ledger)
    with ledger.engine.connect() as connection:
        kept = stored_checkpoints(connection)
    assert [(c.rows, c.digest) for c in kept] == [(3, digests[2]), (6, digests[5])]
    assert all(c.verifies(SIGNER.public_key) and c.key_id == SIGNER.key_id for c in kept)
    now = ledger.checkpoint(SIGNER)
    assert (now.rows, now.digest) == (8, digests[7])
    assert ledger.checkpoint(SIGNER) == now  # the one at this row count stays
    assert Checkpoint.from_line(now.to_line()) == now
    ledger.close()


def test_the_settings_give_the_interval_and_the_signer(tmp_path: Path) -> None:
    settings = LedgerSettings.from_environ(
        {"MEDTPE_LEDGER_CHECKPOINT_ROWS": "2", "MEDTPE_LEDGER_SIGNING_KEY": RFC8037_SEED_B64},
        ledger_url=f"sqlite:///{tmp_path / 'ledger.sqlite3'}",
    )
    assert settings.ledger_checkpoint_rows == 2
    ledger = settings.open_ledger()
    ledger.record([row(0), row(1)])
    with ledger.engine.connect() as connection:
        [kept] = stored_checkpoints(connection)
    assert kept.rows == 2 and kept.key_id == settings.signer().key_id
    ledger.close()
    assert LedgerSettings().ledger_checkpoint_rows == 1_000
    for wrong in ("-1", "ten", "1.5"):
        with pytest.raises(ValueError, match=r"MEDTPE_LEDGER_CHECKPOINT_ROWS=.*whole number"):
            LedgerSettings.from_environ({"MEDTPE_LEDGER_CHECKPOINT_ROWS": wrong})


def write_one_at_a_time(url: str, indexes: list[int], done: multiprocessing.Queue) -> None:
    """A writing process of its own: one transaction per row, a checkpoint every 25 rows."""
    ledger = Ledger.open(url, checkpoint_every=25, signer=lambda: SIGNER)
    for index in indexes:
        ledger.record([row(index)])
    ledger.close()
    done.put(len(indexes))


def test_four_writers_on_one_postgresql_leave_an_intact_chain(
    postgres_server: PostgresServer,
) -> None:
    url = fresh_database(postgres_server)
    Ledger.open(url).close()
    rows = [row(i) for i in range(160)]  # made before the fork, not in each process
    context = multiprocessing.get_context("fork")
    done = context.Queue()
    writers = [
        context.Process(target=write_one_at_a_time, args=(url, list(range(k, 160, 4)), done))
        for k in range(4)
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(120)
        assert writer.exitcode == 0
    assert sorted(done.get(timeout=5) for _ in writers) == [40] * 4
    ledger = Ledger.open(url)
    chain = chain_of(ledger)
    assert [seq for seq, _, _ in chain] == list(range(1, 161))
    assert {found for _, found, _ in chain} == {r.prediction_id for r in rows}
    assert [digest for _, _, digest in chain] == relinked(ledger)
    found = audit(ledger.engine, SIGNER.public_key, deadline_s=60)
    assert found.finding is None and found.rows == 160
    assert found.last_checkpoint is not None and found.last_checkpoint[0].rows == 150
    ledger.close()


def test_the_migration_chains_the_rows_of_a_0002_ledger(ledger_url: str) -> None:
    engine = make_engine(ledger_url, DatabaseTimeouts())
    upgrade(engine, "0002")
    written = [row(i) for i in (5, 2, 8, 0, 7, 1, 4, 6, 3)]  # inserted out of time order
    with engine.begin() as connection:
        for made in written:
            connection.execute(_TABLE.insert().values(made.values() | {"record": None}))
        connection.execute(
            Feedback.__table__.insert().values(
                card_uuid="c1",
                prediction_id=written[0].prediction_id,
                issuer="https://ehr.example",
                outcome="accepted",
                override_reason=None,
                outcome_time=START,
                received_at=START,
            )
        )
    engine.dispose()
    ledger = Ledger.open(ledger_url)
    stored = sorted(written, key=lambda r: r.created_at)
    chain = chain_of(ledger)
    assert [seq for seq, _, _ in chain] == list(range(1, 10))
    assert [found for _, found, _ in chain] == [r.prediction_id for r in stored]
    assert [digest for _, _, digest in chain] == relinked(ledger)
    ledger.record([row(20)])  # the writer goes on after the migrated rows
    assert chain_of(ledger)[-1][:2] == (10, row(20).prediction_id)
    found = audit(ledger.engine, SIGNER.public_key, deadline_s=60)
    assert (found.finding, found.rows) == (None, 10)
    ledger.close()
