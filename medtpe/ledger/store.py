"""The ledger's store: `Ledger.open(url)` (SQLite or PostgreSQL, migrated to the newest schema),
`record(rows)` in one transaction, `get(prediction_id)`, `rows(since, until, task)`.

Every row is appended to the ledger's hash chain (`medtpe.ledger.chain`) in the transaction that
inserts it, under the chain's lock: its place and digest, and every `checkpoint_every` rows a
checkpoint of the chain signed with the ledger's key; `checkpoint` signs one at once.

A write that fails raises `LedgerUnavailable` (the service answers 503 with `Retry-After`: no
answer leaves without its row). Recording is idempotent on `prediction_id`: a row recorded
again with the same content is a no-op, with other content a `LedgerConflict`.

Every wait on the database is bounded (`medtpe.ledger.settings.DatabaseTimeouts`): PostgreSQL
connections are opened within `CONNECT_TIMEOUT_S` with a `statement_timeout` and a
`lock_timeout`, so a table another connection locks (a migration, an index build) is a
`LedgerUnavailable` after the lock timeout, never a wait without end. SQLite runs in WAL mode
with `synchronous=NORMAL` and the lock timeout as its `busy_timeout`, so several processes on
one machine can write to one file. NORMAL: a committed row survives the writing
process's crash (SIGKILL included: it is in the WAL file), not a power cut or an operating-system
crash, which may lose the last commits; FULL would fsync each commit (3.8 ms a row on the
development machine's disk against 0.16 ms, past the ledger's 2 ms budget). A ledger that must
survive power cuts, or that several machines write, is a PostgreSQL (`synchronous_commit=on`).
PostgreSQL URLs use the psycopg 3 driver.

The methods block: from async code call them in a worker thread (`arecord`, or
`asyncio.to_thread`)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from medtpe.ledger import chain
from medtpe.ledger.migrate import upgrade
from medtpe.ledger.receipt import RECEIPT_VERSION, Receipt, canonical_json
from medtpe.ledger.schema import DOORS, Prediction
from medtpe.ledger.settings import DatabaseTimeouts
from medtpe.ledger.signing import Signer

CONNECT_TIMEOUT_S = 5
CHUNK_ROWS = 1_000
"""Rows read back per statement when a `record` retries rows already there, and per batch
while `rows` streams."""
_TABLE = Prediction.__table__
_TIME_COLUMNS = ("created_at", "prediction_time")


class LedgerUnavailable(RuntimeError):
    """The ledger cannot be opened or written now (database down, disk full, locked too
    long): the answer must not leave."""


class LedgerConflict(ValueError):
    """A row recorded again with another content under the same `prediction_id`."""


@dataclass(frozen=True)
class PredictionRow:
    """One ledger row (the `predictions` table's columns; times UTC)."""

    prediction_id: str
    created_at: datetime
    door: str
    caller: str
    site: str | None
    task: str
    subject_id: str
    prediction_time: datetime | None
    answer: str
    """The answer's value as JSON text (`null`: none)."""
    p_yes: float | None
    format_ok: bool
    original_tokens: int
    medtpe_tokens: int
    compression_rate: float
    latency_ms: float
    mode: str
    receipt: str
    """The receipt's canonical JSON text (`medtpe.ledger.receipt.Receipt.canonical`)."""
    signature: str
    key_id: str
    record: str | None = None
    """The canonical record (with `MEDTPE_LEDGER_RECORDS=store` only)."""
    silent: bool = False
    shadow_of: str | None = None

    def __post_init__(self) -> None:
        if self.door not in DOORS:
            raise ValueError(f"door {self.door!r}: expected one of {', '.join(DOORS)}")

    @classmethod
    def signed(
        cls,
        receipt: Receipt,
        signer: Signer,
        *,
        format_ok: bool,
        original_tokens: int,
        medtpe_tokens: int,
        compression_rate: float,
        latency_ms: float,
        record: bytes | None = None,
        shadow_of: str | None = None,
    ) -> PredictionRow:
        """The row of `receipt` (of the version written now) signed by `signer`: every column
        it signs (id, time, door, caller, site, task, subject, prediction time, mode, answer,
        p("yes"), silent) is the receipt's, so the row cannot say otherwise than what is
        signed."""
        if receipt.receipt_version != RECEIPT_VERSION:
            raise ValueError(
                f"a row is signed on a receipt of version {RECEIPT_VERSION}, not "
                f"{receipt.receipt_version}"
            )
        assert receipt.door is not None and receipt.caller is not None  # version 2
        assert receipt.subject_id is not None and receipt.silent is not None
        return cls(
            prediction_id=receipt.prediction_id,
            created_at=_utc_time(receipt.created_at),
            door=receipt.door,
            caller=receipt.caller,
            site=receipt.site,
            task=receipt.task,
            subject_id=receipt.subject_id,
            prediction_time=None
            if receipt.prediction_time is None
            else _utc_time(receipt.prediction_time),
            answer=canonical_json(receipt.answer).decode(),
            p_yes=receipt.p_yes,
            format_ok=format_ok,
            original_tokens=original_tokens,
            medtpe_tokens=medtpe_tokens,
            compression_rate=compression_rate,
            latency_ms=latency_ms,
            mode=receipt.mode,
            receipt=receipt.canonical().decode(),
            signature=signer.sign(receipt),
            key_id=signer.key_id,
            record=None if record is None else record.decode(),
            silent=receipt.silent,
            shadow_of=shadow_of,
        )

    def values(self) -> dict[str, Any]:
        """The row's column values, times as naive UTC (what either database stores)."""
        values = {name: getattr(self, name) for name in _COLUMNS}
        for name in _TIME_COLUMNS:
            values[name] = _naive_utc(values[name])
        return values


_COLUMNS = tuple(field.name for field in dataclasses.fields(PredictionRow))
_CONTENT = tuple(_TABLE.c[name] for name in _COLUMNS)
"""The columns a `PredictionRow` reads (all but the chain's)."""


def _utc_time(text: str) -> datetime:
    """A receipt's time (`utc_text`) as an aware UTC datetime."""
    return datetime.fromisoformat(text.removesuffix("Z")).replace(tzinfo=UTC)


def _naive_utc(when: datetime | None) -> datetime | None:
    if when is None or when.tzinfo is None:
        return when
    return when.astimezone(UTC).replace(tzinfo=None)


def _aware_utc(when: datetime | None) -> datetime | None:
    if when is None:
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def database_url(url: str) -> str:
    """`url` with PostgreSQL's driver named (psycopg 3: `postgresql+psycopg://`)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _milliseconds(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _sqlite_pragmas(timeouts: DatabaseTimeouts, connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA busy_timeout={_milliseconds(timeouts.lock_s)}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
    connection.create_function(chain.LINK_FUNCTION, 2, chain.link, deterministic=True)


def postgres_options(timeouts: DatabaseTimeouts) -> str:
    """The `options` of every PostgreSQL connection: its statement and lock timeouts."""
    return (
        f"-c statement_timeout={_milliseconds(timeouts.statement_s)} "
        f"-c lock_timeout={_milliseconds(timeouts.lock_s)}"
    )


def make_engine(url: str, timeouts: DatabaseTimeouts) -> Engine:
    """A SQLAlchemy engine of the ledger at `url`, every wait bounded by `timeouts` (SQLite: WAL
    pragmas and the busy timeout on every connection; PostgreSQL: psycopg 3, the connect,
    statement and lock timeouts on every connection; a connection the server dropped is replaced
    at its first failure, which `Ledger.record` retries once)."""
    full = make_url(database_url(url))
    if full.get_backend_name() == "sqlite":
        engine = create_engine(full)
        event.listen(engine, "connect", functools.partial(_sqlite_pragmas, timeouts))
        return engine
    if full.get_backend_name() != "postgresql":
        raise ValueError(
            f"ledger URL {full.render_as_string()}: expected sqlite:///PATH or postgresql://…"
        )
    return create_engine(
        full,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "options": postgres_options(timeouts)},
        use_insertmanyvalues=False,
    )


class Ledger:
    """One ledger database."""

    def __init__(
        self,
        engine: Engine,
        *,
        keep_records: bool = False,
        checkpoint_every: int = 0,
        signer: Callable[[], Signer] | None = None,
    ) -> None:
        self.engine = engine
        self.keep_records = keep_records
        """Whether a row's `record` is stored (`MEDTPE_LEDGER_RECORDS=store`) or dropped."""
        self.checkpoint_every = checkpoint_every if signer is not None else 0
        """Rows between the chain's checkpoints signed as rows are recorded (0: none)."""
        self._signer = None if signer is None else functools.cache(signer)

    @classmethod
    def open(
        cls,
        url: str,
        *,
        keep_records: bool = False,
        timeouts: DatabaseTimeouts = DatabaseTimeouts(),  # noqa: B008 (frozen)
        checkpoint_every: int = 0,
        signer: Callable[[], Signer] | None = None,
    ) -> Ledger:
        """The ledger at `url`, migrated to the newest schema, every wait on it bounded by
        `timeouts` (`LedgerSettings.open_ledger` gives the configured ones), a checkpoint of
        its chain signed by `signer` (asked for the first time one is due) at every
        `checkpoint_every`-th row (0 or no signer: none); `LedgerUnavailable` when the database
        cannot be reached."""
        engine = make_engine(url, timeouts)
        try:
            if engine.dialect.name == "sqlite" and engine.url.database not in (None, ":memory:"):
                Path(engine.url.database).parent.mkdir(parents=True, exist_ok=True)
            upgrade(engine)
        except (SQLAlchemyError, OSError) as exc:
            engine.dispose()
            raise LedgerUnavailable(f"the ledger cannot be opened: {database_reason(exc)}") from exc
        return cls(
            engine, keep_records=keep_records, checkpoint_every=checkpoint_every, signer=signer
        )

    def record(self, rows: Sequence[PredictionRow]) -> None:
        """Commit `rows` in one transaction (all or none). A row already recorded with the same
        content is left as it is (a retry); with another content: `LedgerConflict`, nothing
        written. `LedgerUnavailable` when the database cannot be written."""
        unique = self._unique(rows)
        if not unique:
            return
        try:
            self._write(unique)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise LedgerUnavailable(
                    f"the ledger cannot be written: {database_reason(exc)}"
                ) from exc
            try:  # a connection the database dropped (a restart): once more on a new one
                self._write(unique)
            except SQLAlchemyError as again:
                raise LedgerUnavailable(
                    f"the ledger cannot be written: {database_reason(again)}"
                ) from again
        except SQLAlchemyError as exc:
            raise LedgerUnavailable(
                f"the ledger cannot be written: {database_reason(exc)}"
            ) from exc

    def _write(self, unique: dict[str, dict[str, Any]]) -> None:
        """Append the rows not there yet to the chain in one transaction, under the chain's lock;
        those there already (a retry, or a conflict) compared with theirs and left out. One row
        (an answer's) is tried first as new (`_append_one`); several are looked up first, then
        inserted by one statement executed for each (psycopg pipelines them)."""
        if len(unique) == 1 and self._append_one(*unique.values()):
            return
        with self.engine.begin() as connection:
            head = chain.lock_chain(connection)
            fresh = self._not_recorded(connection, unique)
            if fresh:
                appended, _ = chain.chained(fresh, head)
                connection.execute(self._insert(), appended)
                self._sign_due(connection, appended)

    def _append_one(self, values: dict[str, Any]) -> bool:
        """Append one row as new, in as many statements as a plain insert where possible: on
        SQLite one statement reads the head and inserts (`chain.SQLITE_APPEND`: a write
        statement begins with the write lock); on PostgreSQL the lock and the head's read are
        one statement (`chain.lock_chain`), the insert another. False, nothing written, when
        the row's id is there already."""
        try:
            with self.engine.begin() as connection:
                if connection.dialect.name == "sqlite":
                    given = values | {"genesis": chain.GENESIS, "row": chain.row_digest(values)}
                    seq, digest = connection.execute(chain.SQLITE_APPEND, given).one()
                    appended = values | {"chain_seq": seq, "chain_digest": digest}
                else:
                    [appended], _ = chain.chained([values], chain.lock_chain(connection))
                    connection.execute(_TABLE.insert(), appended)
                self._sign_due(connection, [appended])
        except IntegrityError:  # the id is there: a retry, or a conflict
            return False
        return True

    def _not_recorded(
        self, connection: Connection, unique: dict[str, dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The rows of `unique` the ledger does not hold; a `LedgerConflict` when it holds one
        with other content."""
        ids, fresh = list(unique), dict(unique)
        for first in range(0, len(ids), CHUNK_ROWS):
            stored = connection.execute(
                select(*_CONTENT).where(_TABLE.c.prediction_id.in_(ids[first : first + CHUNK_ROWS]))
            ).mappings()
            for existing in stored:
                if _comparable(existing) != fresh.pop(existing["prediction_id"]):
                    raise LedgerConflict(
                        f"prediction {existing['prediction_id']} is recorded already "
                        "with other content"
                    )
        return list(fresh.values())

    def _sign_due(self, connection: Connection, appended: list[dict[str, Any]]) -> None:
        """Store the checkpoints due among the rows just appended."""
        if self._signer is not None and self.checkpoint_every:
            due = chain.due_checkpoints(appended, self.checkpoint_every, self._signer)
            chain.record_checkpoints(connection, list(due))

    def checkpoint(self, signer: Signer) -> chain.Checkpoint:
        """The chain's head signed by `signer` now and stored (the one already stored at this
        row count when there is one); `LedgerUnavailable` when the ledger cannot be written."""
        try:
            with self.engine.connect() as connection, connection.begin():
                return chain.checkpoint_now(connection, signer)
        except SQLAlchemyError as exc:
            raise LedgerUnavailable(
                f"the ledger cannot be written: {database_reason(exc)}"
            ) from exc

    async def arecord(self, rows: Sequence[PredictionRow]) -> None:
        """`record` in a worker thread (for the event loop of the service)."""
        await asyncio.to_thread(self.record, rows)

    def get(self, prediction_id: str) -> PredictionRow | None:
        """The row of `prediction_id` (None: no such prediction)."""
        try:
            with self.engine.connect() as connection:
                found = (
                    connection.execute(
                        select(*_CONTENT).where(_TABLE.c.prediction_id == prediction_id)
                    )
                    .mappings()
                    .first()
                )
        except SQLAlchemyError as exc:
            raise LedgerUnavailable(f"the ledger cannot be read: {database_reason(exc)}") from exc
        return None if found is None else stored_row(found)

    def chain_link_holds(self, prediction_id: str) -> bool | None:
        """Whether the row of `prediction_id` is the chain's link it says it is: its
        `chain_digest` is the link of the row before it and of its own columns as stored now
        (every column, those its receipt does not sign included; `medtpe.ledger.chain`). None
        when that cannot be told: no such row, a row outside the chain, or the row before it
        gone (retention); `medtpe ledger audit` walks the whole chain."""
        columns = [_TABLE.c[name] for name in chain.CHAINED_COLUMNS]
        seq_column, digest_column = _TABLE.c.chain_seq, _TABLE.c.chain_digest
        try:
            with self.engine.connect() as connection:
                found = (
                    connection.execute(
                        select(*columns, seq_column, digest_column).where(
                            _TABLE.c.prediction_id == prediction_id
                        )
                    )
                    .mappings()
                    .first()
                )
                if found is None or found["chain_seq"] is None:
                    return None
                previous = (
                    chain.GENESIS
                    if found["chain_seq"] == 1
                    else connection.execute(
                        select(digest_column).where(seq_column == found["chain_seq"] - 1)
                    ).scalar_one_or_none()
                )
        except SQLAlchemyError as exc:
            raise LedgerUnavailable(f"the ledger cannot be read: {database_reason(exc)}") from exc
        if previous is None:
            return None
        return chain.link(previous, chain.row_digest(found)) == found["chain_digest"]

    def recorded(self, prediction_ids: Sequence[str]) -> dict[str, tuple[datetime, str]]:
        """When each of `prediction_ids` the ledger holds was recorded (UTC) and whom it is
        about (its `subject_id`), read `CHUNK_ROWS` ids per statement; ids it does not hold are
        left out."""
        found: dict[str, tuple[datetime, str]] = {}
        ids = list(dict.fromkeys(prediction_ids))
        columns = (_TABLE.c.prediction_id, _TABLE.c.created_at, _TABLE.c.subject_id)
        try:
            with self.engine.connect() as connection:
                for start in range(0, len(ids), CHUNK_ROWS):
                    chunk = ids[start : start + CHUNK_ROWS]
                    query = select(*columns).where(_TABLE.c.prediction_id.in_(chunk))
                    for prediction_id, created_at, subject_id in connection.execute(query):
                        found[prediction_id] = (_aware_utc(created_at), subject_id)
        except SQLAlchemyError as exc:
            raise LedgerUnavailable(f"the ledger cannot be read: {database_reason(exc)}") from exc
        return found

    def rows(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        task: str | None = None,
    ) -> Iterator[PredictionRow]:
        """The rows created at or after `since` and before `until`, of `task`, oldest first
        (read in batches, streamed)."""
        query = select(*_CONTENT).order_by(_TABLE.c.created_at, _TABLE.c.prediction_id)
        if since is not None:
            query = query.where(_TABLE.c.created_at >= _naive_utc(since))
        if until is not None:
            query = query.where(_TABLE.c.created_at < _naive_utc(until))
        if task is not None:
            query = query.where(_TABLE.c.task == task)
        try:
            with self.engine.connect() as connection:
                result = connection.execution_options(yield_per=CHUNK_ROWS).execute(query)
                for found in result.mappings():
                    yield stored_row(found)
        except SQLAlchemyError as exc:
            raise LedgerUnavailable(f"the ledger cannot be read: {database_reason(exc)}") from exc

    def close(self) -> None:
        """Close the database connections."""
        self.engine.dispose()

    async def aclose(self) -> None:
        """`close` in a worker thread."""
        await asyncio.to_thread(self.close)

    def _unique(self, rows: Sequence[PredictionRow]) -> dict[str, dict[str, Any]]:
        """Each row's values by id (records dropped unless kept); a LedgerConflict when one id
        comes twice with different content."""
        unique: dict[str, dict[str, Any]] = {}
        for row in rows:
            values = row.values()
            if not self.keep_records:
                values["record"] = None
            earlier = unique.setdefault(row.prediction_id, values)
            if earlier != values:
                raise LedgerConflict(
                    f"prediction {row.prediction_id} comes twice with different content"
                )
        return unique

    def _insert(self) -> Any:
        """INSERT … ON CONFLICT (prediction_id) DO NOTHING in this database's dialect."""
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        return dialect.insert(_TABLE).on_conflict_do_nothing(index_elements=["prediction_id"])


def _comparable(found: Any) -> dict[str, Any]:
    values = dict(found)
    for name in _TIME_COLUMNS:
        values[name] = _naive_utc(values[name])
    return values


def stored_row(found: Any) -> PredictionRow:
    """The `PredictionRow` of a row's columns as read (its times UTC)."""
    values = dict(found)
    for name in _TIME_COLUMNS:
        values[name] = _aware_utc(values[name])
    return PredictionRow(**values)


def database_reason(exc: Exception) -> str:
    """The database's own message, first line (no SQL, no parameters: they hold PHI)."""
    original = getattr(exc, "orig", None) or exc
    return str(original).strip().splitlines()[0] if str(original).strip() else type(exc).__name__
