"""What happened after the ledger's predictions, in its `outcomes` and `attributes` tables:
each prediction's outcome (`known`, `open`, `no_label`) and cohort attributes, as `medtpe
outcomes` finds them (`medtpe.monitoring.outcomes`). Recording again replaces them: an outcome
row is updated in place, a prediction's attributes replaced whole, nothing duplicated.

Rows are committed `CHUNK` at a time, one short transaction each: a SQLite ledger's write lock is
held for one chunk (milliseconds), never for a whole join, so the service's writes go on between
two chunks. `awaiting_outcome` reads only the predictions whose outcome is not known yet (none
recorded, or `open`): a nightly join labels what is new, not every prediction again."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from medtpe.core.meds.events import to_naive_utc
from medtpe.ledger.schema import Attribute, Outcome, Prediction
from medtpe.ledger.store import CHUNK_ROWS, Ledger, LedgerUnavailable, database_reason

CHUNK = 500
"""Outcome rows per transaction (their attributes with them) when outcomes are written."""
SOURCE_CHARS = 500
"""The longest `source` kept (its column's length)."""
_OUTCOMES = Outcome.__table__
_ATTRIBUTES = Attribute.__table__
_PREDICTIONS = Prediction.__table__


@dataclass(frozen=True)
class OutcomeRow:
    """One prediction's outcome and cohort attributes (times naive UTC)."""

    prediction_id: str
    status: str
    label: bool | None
    horizon_end: datetime | None
    attributes: dict[str, str]


def record_outcomes(
    ledger: Ledger,
    rows: Sequence[OutcomeRow],
    *,
    source: str,
    data_end: datetime | None,
    joined_at: datetime,
) -> None:
    """Upsert the outcomes and replace the attributes of `rows`, read from `source` (data up to
    `data_end`) at `joined_at`, `CHUNK` rows a transaction (a chunk all or none; the chunks
    before a failure stay, and recording them again changes nothing); `LedgerUnavailable` when
    the database cannot be written."""
    dialect = postgresql if ledger.engine.dialect.name == "postgresql" else sqlite
    common = {
        "data_end": None if data_end is None else to_naive_utc(data_end),
        "source": source[:SOURCE_CHARS],
        "joined_at": to_naive_utc(joined_at),
    }
    try:
        for start in range(0, len(rows), CHUNK):
            chunk = rows[start : start + CHUNK]
            values = [
                {
                    "prediction_id": row.prediction_id,
                    "status": row.status,
                    "label": row.label,
                    "horizon_end": row.horizon_end,
                    **common,
                }
                for row in chunk
            ]
            insert = dialect.insert(_OUTCOMES).values(values)
            updated = {c: insert.excluded[c] for c in values[0] if c != "prediction_id"}
            ids = [row.prediction_id for row in chunk]
            named = [
                {"prediction_id": row.prediction_id, "name": name, "value": value}
                for row in chunk
                for name, value in sorted(row.attributes.items())
            ]
            with ledger.engine.begin() as connection:
                connection.execute(
                    insert.on_conflict_do_update(index_elements=["prediction_id"], set_=updated)
                )
                connection.execute(delete(_ATTRIBUTES).where(_ATTRIBUTES.c.prediction_id.in_(ids)))
                if named:
                    connection.execute(_ATTRIBUTES.insert().values(named))
    except SQLAlchemyError as exc:
        raise LedgerUnavailable(f"the ledger cannot be written: {database_reason(exc)}") from exc


def awaiting_outcome(ledger: Ledger, task: str) -> Iterator[tuple[str, str, datetime | None]]:
    """(prediction id, subject id, prediction time as naive UTC) of each prediction of `task`
    whose outcome is not known yet (no outcome recorded, or `open`), by subject (each subject's
    predictions together, oldest first), streamed `CHUNK_ROWS` at a time; `LedgerUnavailable`
    when the ledger cannot be read."""
    p, o = _PREDICTIONS.c, _OUTCOMES.c
    query = (
        select(p.prediction_id, p.subject_id, p.prediction_time)
        .select_from(_PREDICTIONS.outerjoin(_OUTCOMES))
        .where(p.task == task, or_(o.prediction_id.is_(None), o.status == "open"))
        .order_by(p.subject_id, p.created_at, p.prediction_id)
    )
    try:
        with ledger.engine.connect() as connection:
            result = connection.execution_options(yield_per=CHUNK_ROWS).execute(query)
            for prediction_id, subject_id, when in result:
                yield prediction_id, subject_id, None if when is None else to_naive_utc(when)
    except SQLAlchemyError as exc:
        raise LedgerUnavailable(f"the ledger cannot be read: {database_reason(exc)}") from exc
