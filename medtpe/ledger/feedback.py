"""CDS feedback in the ledger's `feedback` table: what the EHR's user did with a card (accepted,
overridden, and why), joined to the card's prediction; the monitoring report reads override
rates from it. Recording is idempotent per card: an EHR that retries a feedback call after a
503 writes nothing twice (the first outcome recorded stays). Feedback on a prediction the ledger
does not hold (a card issued while the ledger was off) is refused whole: `UnrecordedPredictions`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from medtpe.ledger.schema import Feedback, Prediction
from medtpe.ledger.store import Ledger, LedgerUnavailable, database_reason

_TABLE = Feedback.__table__
_ID = Prediction.__table__.c.prediction_id


@dataclass(frozen=True)
class FeedbackRow:
    """One card's outcome (times naive UTC)."""

    card_uuid: str
    prediction_id: str
    issuer: str
    outcome: str
    override_reason: str | None
    outcome_time: datetime
    received_at: datetime


class UnrecordedPredictions(ValueError):
    """Feedback naming predictions the ledger does not hold; nothing of it was written."""

    def __init__(self, indices: list[int]) -> None:
        super().__init__(f"no prediction in the ledger for feedback items {indices}")
        self.indices = indices
        """The positions of those rows in the rows given."""


def record_feedback(ledger: Ledger, rows: Sequence[FeedbackRow]) -> None:
    """Commit `rows` in one transaction (a card recorded before is left as it is);
    `UnrecordedPredictions` (nothing written) when the ledger holds no prediction of some;
    `LedgerUnavailable` when the database cannot be written."""
    if not rows:
        return
    dialect = postgresql if ledger.engine.dialect.name == "postgresql" else sqlite
    insert = dialect.insert(_TABLE).on_conflict_do_nothing(index_elements=["card_uuid"])
    named = {row.prediction_id for row in rows}
    try:
        with ledger.engine.begin() as connection:
            held = set(connection.scalars(select(_ID).where(_ID.in_(named))))
            if missing := [i for i, row in enumerate(rows) if row.prediction_id not in held]:
                raise UnrecordedPredictions(missing)
            connection.execute(insert, [asdict(row) for row in rows])
    except SQLAlchemyError as exc:
        raise LedgerUnavailable(f"the ledger cannot be written: {database_reason(exc)}") from exc
