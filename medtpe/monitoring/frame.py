"""The ledger's predictions of a period with their outcomes, attributes and feedback, as
columns (one numpy array per field), read in one pass."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
from sqlalchemy import Engine, select

from medtpe.ledger.schema import Attribute, Feedback, Outcome, Prediction

_P, _O = Prediction.__table__.c, Outcome.__table__.c
REASON_CHARS = 100


@dataclass
class Monitored:
    """Predictions as columns (`created_at` naive UTC); `label` is NaN unless the outcome is
    known; `attributes` holds one array per attribute name ('' where the row has none)."""

    prediction_id: np.ndarray
    created_at: np.ndarray  # datetime64[us]
    task: np.ndarray
    site: np.ndarray  # '' where none
    subject_id: np.ndarray
    prediction_time: np.ndarray  # datetime64[us], NaT where none (the record's clock)
    answer: np.ndarray
    p_yes: np.ndarray  # NaN where none
    latency_ms: np.ndarray
    silent: np.ndarray
    shadow_of: np.ndarray  # '' where not a shadow
    status: np.ndarray  # outcome status, '' where not joined
    label: np.ndarray  # 1.0 / 0.0 / NaN
    horizon_end: np.ndarray  # datetime64[us], NaT where none
    attributes: dict[str, np.ndarray]
    in_period: np.ndarray
    """False for a row outside the period read only because a shadow row in it shadows it."""
    feedback: dict[str, list[tuple[str, str | None]]]
    """(outcome, override reason) of each prediction's CDS feedback, by prediction id."""

    def __len__(self) -> int:
        return len(self.prediction_id)


def naive_utc(when: datetime | None) -> datetime | None:
    """`when` as naive UTC (a naive time is taken as UTC already)."""
    if when is None or when.tzinfo is None:
        return when
    return when.astimezone(UTC).replace(tzinfo=None)


def read_monitored(
    engine: Engine, since: datetime | None = None, until: datetime | None = None
) -> Monitored:
    """The predictions created in [since, until) with their outcomes, attributes and feedback
    (and every row a shadow row there shadows, without its attributes and feedback)."""
    base = (
        select(
            _P.prediction_id, _P.created_at, _P.task, _P.site, _P.subject_id, _P.answer,
            _P.p_yes, _P.latency_ms, _P.silent, _P.shadow_of, _O.status, _O.label,
            _P.prediction_time, _O.horizon_end,
        )
        .select_from(Prediction.__table__.outerjoin(Outcome.__table__))
        .order_by(_P.created_at, _P.prediction_id)
    )  # fmt: skip
    period = []
    if since is not None:
        period.append(_P.created_at >= naive_utc(since))
    if until is not None:
        period.append(_P.created_at < naive_utc(until))
    query = base.where(*period)
    attribute, card = Attribute.__table__, Feedback.__table__
    with engine.connect() as connection:
        rows = connection.execute(query).all()
        n_period = len(rows)
        ids = {r[0] for r in rows}
        shadowed = {r[9] for r in rows if r[9] is not None} - ids
        if shadowed:
            rows.extend(
                connection.execute(base.where(_P.prediction_id.in_(sorted(shadowed)))).all()
            )
        attributes = connection.execute(
            select(attribute.c.prediction_id, attribute.c.name, attribute.c.value)
            .join(Prediction.__table__)
            .where(*period)
        ).all()
        feedback = connection.execute(
            select(card.c.prediction_id, card.c.outcome, card.c.override_reason)
            .join(Prediction.__table__)
            .where(*period)
        ).all()
    return _columns(rows, n_period, attributes, feedback)


def _columns(rows: list, n_period: int, attributes: list, feedback: list) -> Monitored:
    ids = np.array([r[0] for r in rows], dtype=object)
    index = {pid: i for i, pid in enumerate(ids)}
    named: dict[str, np.ndarray] = {}
    for pid, name, value in attributes:
        if pid in index:
            column = named.setdefault(name, np.full(len(ids), "", dtype=object))
            column[index[pid]] = value
    cards: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for pid, outcome, reason in feedback:
        if pid in index:
            cards[pid].append((outcome, _reason_text(reason)))
    return Monitored(
        prediction_id=ids,
        created_at=_times([r[1] for r in rows]),
        task=np.array([r[2] for r in rows], dtype=object),
        site=np.array([r[3] or "" for r in rows], dtype=object),
        subject_id=np.array([r[4] for r in rows], dtype=object),
        answer=np.array([r[5] for r in rows], dtype=object),
        p_yes=np.array([np.nan if r[6] is None else r[6] for r in rows], dtype=float),
        latency_ms=np.array([r[7] for r in rows], dtype=float),
        silent=np.array([bool(r[8]) for r in rows], dtype=bool),
        shadow_of=np.array([r[9] or "" for r in rows], dtype=object),
        status=np.array([r[10] or "" for r in rows], dtype=object),
        label=np.array(
            [float(r[11]) if r[10] == "known" and r[11] is not None else np.nan for r in rows]
        ),
        prediction_time=_times([r[12] for r in rows]),
        horizon_end=_times([r[13] for r in rows]),
        attributes=named,
        in_period=np.arange(len(rows)) < n_period,
        feedback=dict(cards),
    )


def _times(values: list[datetime | None]) -> np.ndarray:
    return np.array([naive_utc(v) for v in values], dtype="datetime64[us]")


def _reason_text(reason: str | None) -> str | None:
    """An override reason as the report shows it: the CDS feedback's reason code (or the
    user's comment), cut to `REASON_CHARS`."""
    return None if reason is None else reason[:REASON_CHARS]
