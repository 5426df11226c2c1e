"""What happened after the ledger's predictions, in its `outcomes` and `attributes` tables:
each prediction's outcome (`known`, `open`, `no_label`) and cohort attributes, as `medtpe
outcomes` finds them (`medtpe.monitoring.outcomes`). Recording again replaces them: an outcome
row is updated in place, a prediction's attributes replaced whole, nothing duplicated."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from medtpe.core.meds.events import to_naive_utc
from medtpe.ledger.schema import Attribute, Outcome
from medtpe.ledger.store import Ledger, LedgerUnavailable, database_reason

CHUNK = 1_000
"""Rows per statement when outcomes and attributes are written."""
SOURCE_CHARS = 500
"""The longest `source` kept (its column's length)."""
_OUTCOMES = Outcome.__table__
_ATTRIBUTES = Attribute.__table__


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
    `data_end`) at `joined_at`, in one transaction (all or none); `LedgerUnavailable` when the
    database cannot be written."""
    dialect = postgresql if ledger.engine.dialect.name == "postgresql" else sqlite
    common = {
        "data_end": None if data_end is None else to_naive_utc(data_end),
        "source": source[:SOURCE_CHARS],
        "joined_at": to_naive_utc(joined_at),
    }
    try:
        with ledger.engine.begin() as connection:
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
                connection.execute(
                    insert.on_conflict_do_update(index_elements=["prediction_id"], set_=updated)
                )
                ids = [row.prediction_id for row in chunk]
                connection.execute(delete(_ATTRIBUTES).where(_ATTRIBUTES.c.prediction_id.in_(ids)))
                named = [
                    {"prediction_id": row.prediction_id, "name": name, "value": value}
                    for row in chunk
                    for name, value in sorted(row.attributes.items())
                ]
                if named:
                    connection.execute(_ATTRIBUTES.insert().values(named))
    except SQLAlchemyError as exc:
        raise LedgerUnavailable(f"the ledger cannot be written: {database_reason(exc)}") from exc
