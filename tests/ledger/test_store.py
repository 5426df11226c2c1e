"""The ledger's store on SQLite (WAL) and on a real PostgreSQL server, the same tests on both:
migrations from an empty database, rows read back as written, idempotent retries, conflicts
refused whole, filters, two writing processes, a database that is gone."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, inspect, select

from medtpe.ledger import store
from medtpe.ledger.migrate import current, head
from medtpe.ledger.schema import Base, Prediction
from medtpe.ledger.store import Ledger, LedgerConflict, LedgerUnavailable, database_url
from tests.support.ledger_rows import START, row
from tests.support.postgres import PostgresServer
from tests.support.server_fixtures import fresh_database


def count(ledger: Ledger) -> int:
    with ledger.engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(Prediction)).scalar_one()


def test_opening_an_empty_database_migrates_it_to_the_models(ledger_url: str) -> None:
    ledger = Ledger.open(ledger_url)
    try:
        with ledger.engine.connect() as connection:
            assert current(connection) == head()
            tables = set(inspect(connection).get_table_names())
            differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        assert {"predictions", "feedback", "alembic_version"} <= tables
        assert differences == []
    finally:
        ledger.close()
    Ledger.open(ledger_url).close()  # a second open finds it at head


def test_a_row_reads_back_as_it_was_recorded(ledger_url: str) -> None:
    ledger = Ledger.open(ledger_url, keep_records=True)
    written = [row(0), row(1)]
    ledger.record(written)
    assert ledger.get(written[0].prediction_id) == written[0]
    assert ledger.get(written[1].prediction_id) == written[1]
    assert ledger.get("no-such-id") is None
    assert written[0].p_yes == 1 / 3 and written[0].record is not None
    ledger.close()


def test_records_are_dropped_unless_kept(ledger_url: str) -> None:
    ledger = Ledger.open(ledger_url)
    ledger.record([row(0)])
    found = ledger.get(row(0).prediction_id)
    assert found is not None and found.record is None
    assert found == dataclasses.replace(row(0), record=None)
    ledger.close()


def test_a_retry_records_nothing_twice_and_other_content_is_refused_whole(
    ledger_url: str,
) -> None:
    ledger = Ledger.open(ledger_url)
    ledger.record([row(0), row(1)])
    ledger.record([row(1), row(0), row(2), row(2)])  # a retry, one new row, a duplicate
    assert count(ledger) == 3
    changed = dataclasses.replace(row(1), answer='"no"')
    with pytest.raises(LedgerConflict, match=row(1).prediction_id):
        ledger.record([row(3), changed])
    with pytest.raises(LedgerConflict, match="twice"):
        ledger.record([row(4), dataclasses.replace(row(4), latency_ms=1.0)])
    assert count(ledger) == 3  # neither row(3) nor row(4): all or none
    assert ledger.get(row(1).prediction_id) == dataclasses.replace(row(1), record=None)
    ledger.close()


def test_rows_are_read_by_time_and_task(ledger_url: str) -> None:
    ledger = Ledger.open(ledger_url)
    ledger.record([row(i) for i in range(10)])
    ledger.record([dataclasses.replace(row(10), task="readmission_30d")])
    since, until = START + timedelta(milliseconds=3), START + timedelta(milliseconds=7)
    assert [r.prediction_id for r in ledger.rows(since, until)] == [
        row(i).prediction_id for i in range(3, 7)
    ]
    assert [r.prediction_id for r in ledger.rows(task="readmission_30d")] == [row(10).prediction_id]
    assert len(list(ledger.rows())) == 11
    ledger.close()


def test_the_times_and_subjects_of_ids_are_read_in_chunks(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "CHUNK_ROWS", 2)
    ledger = Ledger.open(ledger_url)
    rows = [row(i) for i in range(5)]
    ledger.record(rows)
    asked = [r.prediction_id for r in rows] + ["not-there", rows[0].prediction_id]
    assert ledger.recorded(asked) == {r.prediction_id: (r.created_at, "7") for r in rows}
    assert ledger.recorded([]) == {}
    ledger.close()


def test_a_large_batch_is_one_transaction(ledger_url: str) -> None:
    ledger = Ledger.open(ledger_url)
    ledger.record([row(i) for i in range(1_200)])
    assert count(ledger) == 1_200
    ledger.close()


def write_rows(url: str, indexes: list[int], result: multiprocessing.Queue) -> None:
    """A process's writes: one transaction per 5 rows (a writer of its own)."""
    ledger = Ledger.open(url)
    for start in range(0, len(indexes), 5):
        ledger.record([row(i) for i in indexes[start : start + 5]])
    ledger.close()
    result.put(len(indexes))


def test_two_processes_writing_at_once_lose_and_duplicate_nothing(ledger_url: str) -> None:
    """Two processes open the empty database at once (both migrate) and write 150 rows each,
    50 of them the same ids (retries of the other's): every row once."""
    rows = [row(i) for i in range(250)]  # made before the fork, not in each process
    context = multiprocessing.get_context("fork")
    result = context.Queue()
    writers = [
        context.Process(target=write_rows, args=(ledger_url, list(span), result))
        for span in (range(0, 150), range(100, 250))
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
        assert writer.exitcode == 0
    assert sorted(result.get(timeout=5) for _ in writers) == [150, 150]
    ledger = Ledger.open(ledger_url)
    assert count(ledger) == 250
    assert {r.prediction_id for r in ledger.rows()} == {r.prediction_id for r in rows}
    ledger.close()


def test_a_stopped_postgresql_is_unavailable_and_a_restarted_one_is_written_again(
    postgres_server: PostgresServer,
) -> None:
    ledger = Ledger.open(fresh_database(postgres_server))
    ledger.record([row(0)])
    postgres_server.stop()
    try:
        with pytest.raises(LedgerUnavailable, match="cannot be written"):
            ledger.record([row(1)])
        with pytest.raises(LedgerUnavailable, match="cannot be read"):
            ledger.get(row(0).prediction_id)
    finally:
        postgres_server.start()
    ledger.record([row(1)])
    assert count(ledger) == 2
    ledger.close()


def test_an_unreachable_database_cannot_be_opened(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(LedgerUnavailable, match="cannot be opened"):
        Ledger.open(f"sqlite:///{tmp_path / 'file' / 'ledger.sqlite3'}")
    with pytest.raises(LedgerUnavailable, match="cannot be opened"):
        Ledger.open("postgresql://nobody@127.0.0.1:1/none")


def test_sqlite_runs_in_wal_with_normal_sync(tmp_path: Path) -> None:
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    with ledger.engine.connect() as connection:
        pragmas = [
            connection.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "synchronous", "busy_timeout")
        ]
    assert pragmas == ["wal", 1, 10_000]
    ledger.close()


def test_postgresql_urls_get_the_psycopg_driver() -> None:
    assert database_url("postgresql://u:p@h:5/db") == "postgresql+psycopg://u:p@h:5/db"
    assert database_url("postgres://h/db") == "postgresql+psycopg://h/db"
    assert database_url("sqlite:///x.db") == "sqlite:///x.db"


def write_until_killed(url: str, committed: Any) -> None:
    """Record rows one at a time, telling the parent each id once its commit returned."""
    ledger = Ledger.open(url)
    for index in range(10_000):
        ledger.record([row(index)])
        committed.send(index)


def test_every_row_a_killed_writer_committed_is_there(ledger_url: str) -> None:
    """A writer SIGKILLed mid-run (an API process killed): every row whose `record` returned
    (an answer that could have left) is in the ledger, none twice."""
    Ledger.open(ledger_url).close()  # migrated before the writer starts
    [row(i) for i in range(60)]  # made before the fork
    context = multiprocessing.get_context("fork")
    receiving, sending = context.Pipe(duplex=False)
    writer = context.Process(target=write_until_killed, args=(ledger_url, sending))
    writer.start()
    seen = [receiving.recv() for _ in range(40)]
    os.kill(writer.pid, signal.SIGKILL)
    writer.join(10)
    while receiving.poll():
        seen.append(receiving.recv())
    ledger = Ledger.open(ledger_url)
    stored = {r.prediction_id for r in ledger.rows()}
    assert {row(i).prediction_id for i in seen} <= stored
    assert count(ledger) == len(stored) >= len(seen)
    ledger.close()
