"""The ledger's predictions of a period with their outcomes, attributes and feedback, as
columns (one numpy array per field), streamed from the database `READ_ROWS` rows at a time.

Memory is bounded in bytes: the columns hold a row in a few hundred bytes (its id's text, times
and numbers as numpy values, every repeated text — task, site, subject, answer, status, attribute
values — one shared object), the bootstrap holds a block of weights at a time
(`medtpe.monitoring.figures.BOOTSTRAP_BLOCK_BYTES`), and a period of more than `MAX_REPORT_ROWS`
predictions is refused before anything is read (`PeriodTooLarge`, naming the count and the
bound); docs/benchmarks.md measures the peak against rows."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import SQLAlchemyError

from medtpe.ledger.schema import Attribute, Feedback, Outcome, Prediction
from medtpe.ledger.store import LedgerUnavailable, database_reason

_P, _O = Prediction.__table__.c, Outcome.__table__.c
REASON_CHARS = 100
READ_ROWS = 10_000
"""Rows fetched per round trip (a server-side cursor on PostgreSQL)."""
MAX_REPORT_ROWS = 3_800_000
"""The most predictions one report reads (a year of a 10,000-a-day site is 3.65 M): past it the
period is refused, to be reported in parts (`--since`/`--until`). The report's peak measured about
0.54 GB and 374 bytes a row (docs/benchmarks.md): at most about 1.97 GB."""
LOOKUP_CHUNK = 1_000
"""Prediction ids per statement when rows outside the period are read by id."""


class PeriodTooLarge(ValueError):
    """A period holding more predictions than one report reads (`MAX_REPORT_ROWS`)."""


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

    _order: np.ndarray | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.prediction_id)

    def positions(self, prediction_ids: Sequence[str] | np.ndarray) -> np.ndarray:
        """The row index of each of `prediction_ids` (-1 where there is none): a binary search
        in the ids sorted once (8 bytes a row), never a dict of every id."""
        wanted = np.asarray(prediction_ids, dtype=object)
        if not len(self) or not len(wanted):
            return np.full(len(wanted), -1, dtype=np.int64)
        if self._order is None:
            self._order = np.argsort(self.prediction_id, kind="stable")
        ordered = self.prediction_id[self._order]
        at = np.minimum(np.searchsorted(ordered, wanted), len(self) - 1)
        return np.where(ordered[at] == wanted, self._order[at], -1)


def naive_utc(when: datetime | None) -> datetime | None:
    """`when` as naive UTC (a naive time is taken as UTC already)."""
    if when is None or when.tzinfo is None:
        return when
    return when.astimezone(UTC).replace(tzinfo=None)


def read_monitored(
    engine: Engine,
    since: datetime | None = None,
    until: datetime | None = None,
    *,
    max_rows: int = MAX_REPORT_ROWS,
) -> Monitored:
    """The predictions created in [since, until) with their outcomes, attributes and feedback
    (and every row a shadow row there shadows, without its attributes and feedback), streamed;
    `PeriodTooLarge` past `max_rows` predictions, `LedgerUnavailable` when the ledger cannot be
    read (its statements bounded by the ledger's timeouts)."""
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
    attribute, card = Attribute.__table__, Feedback.__table__
    try:
        with engine.connect() as connection:
            counted = connection.execute(
                select(func.count()).select_from(Prediction.__table__).where(*period)
            ).scalar_one()
            if counted > max_rows:
                raise PeriodTooLarge(
                    f"the period holds {counted:,} predictions, more than one report reads "
                    f"({max_rows:,}): report it in parts with --since and --until"
                )
            columns = _Columns()
            columns.add_rows(_streamed(connection, base.where(*period)))
            n_period = len(columns)
            data = columns.monitored(n_period)
            outside = _outside(data)
            for first in range(0, len(outside), LOOKUP_CHUNK):
                chosen = outside[first : first + LOOKUP_CHUNK]
                columns.add_rows(_streamed(connection, base.where(_P.prediction_id.in_(chosen))))
            if outside:
                data = columns.monitored(n_period)
            _add_attributes(
                data,
                _streamed(
                    connection,
                    select(attribute.c.prediction_id, attribute.c.name, attribute.c.value)
                    .join(Prediction.__table__)
                    .where(*period),
                ),
            )
            _add_feedback(
                data,
                _streamed(
                    connection,
                    select(card.c.prediction_id, card.c.outcome, card.c.override_reason)
                    .join(Prediction.__table__)
                    .where(*period),
                ),
            )
    except SQLAlchemyError as exc:
        raise LedgerUnavailable(f"the ledger cannot be read: {database_reason(exc)}") from exc
    return data


def _streamed(connection: Connection, query: Any) -> Any:
    """The query's rows in lists of up to `READ_ROWS` (a server-side cursor on PostgreSQL)."""
    return connection.execution_options(yield_per=READ_ROWS).execute(query).partitions()


def _outside(data: Monitored) -> list[str]:
    """The ids that the period's shadow rows shadow and that the period does not hold."""
    shadowed = np.unique(data.shadow_of[data.shadow_of != ""]).astype(object)
    return sorted(str(pid) for pid in shadowed[data.positions(shadowed) < 0])


class _Shared(dict[Any, Any]):
    """Each text once: the object first seen stands for every equal one after it."""

    def __call__(self, value: Any) -> Any:
        return self.setdefault(value, value)


@dataclass
class _Columns:
    """Rows gathered as numpy chunks, each repeated text one shared object."""

    chunks: dict[str, list[np.ndarray]] = field(default_factory=lambda: defaultdict(list))
    texts: _Shared = field(default_factory=_Shared)
    rows: int = 0

    def __len__(self) -> int:
        return self.rows

    def add_rows(self, partitions: Any) -> None:
        """Append the rows of `partitions` (the columns of `read_monitored`'s query)."""
        shared = self.texts
        for rows in partitions:
            self.rows += len(rows)
            put = self.chunks
            put["prediction_id"].append(np.array([r[0] for r in rows], dtype=object))
            put["created_at"].append(_times([r[1] for r in rows]))
            put["task"].append(_objects(rows, 2, shared))
            put["site"].append(_objects(rows, 3, lambda r: shared(r or "")))
            put["subject_id"].append(_objects(rows, 4, shared))
            put["answer"].append(_objects(rows, 5, shared))
            put["p_yes"].append(np.array([np.nan if r[6] is None else r[6] for r in rows]))
            put["latency_ms"].append(np.array([r[7] for r in rows], dtype=float))
            put["silent"].append(np.array([bool(r[8]) for r in rows], dtype=bool))
            put["shadow_of"].append(_objects(rows, 9, lambda r: shared(r or "")))
            put["status"].append(_objects(rows, 10, lambda r: shared(r or "")))
            put["label"].append(
                np.array(
                    [
                        float(r[11]) if r[10] == "known" and r[11] is not None else np.nan
                        for r in rows
                    ],
                    dtype=float,
                )
            )
            put["prediction_time"].append(_times([r[12] for r in rows]))
            put["horizon_end"].append(_times([r[13] for r in rows]))

    def monitored(self, n_period: int) -> Monitored:
        """The rows gathered so far as one `Monitored` (the first `n_period` in the period)."""
        kinds = {"created_at": "datetime64[us]", "prediction_time": "datetime64[us]"}
        kinds |= {"horizon_end": "datetime64[us]", "silent": bool}
        kinds |= {"p_yes": float, "latency_ms": float, "label": float}
        joined = {}
        for name in Monitored.__dataclass_fields__:
            if name in ("attributes", "in_period", "feedback", "_order"):
                continue
            parts = self.chunks[name]
            joined[name] = (
                np.concatenate(parts) if parts else np.array([], dtype=kinds.get(name, object))
            )
            self.chunks[name] = [joined[name]]
        return Monitored(
            **joined,
            attributes={},
            in_period=np.arange(self.rows) < n_period,
            feedback={},
        )


def _objects(rows: Sequence[Any], column: int, value: Callable[[Any], Any]) -> np.ndarray:
    """Column `column` of `rows` as an object array, each value through `value`."""
    out = np.empty(len(rows), dtype=object)
    out[:] = [value(r[column]) for r in rows]
    return out


def _add_attributes(data: Monitored, partitions: Any) -> None:
    """Fill `data.attributes` from (prediction id, name, value) rows ('' where none)."""
    shared = _Shared()
    for rows in partitions:
        at = data.positions([r[0] for r in rows])
        for row, (_, name, value) in zip(at, rows, strict=True):
            if row >= 0:
                column = data.attributes.get(name)
                if column is None:
                    column = data.attributes[name] = np.full(len(data), "", dtype=object)
                column[row] = shared(value)


def _add_feedback(data: Monitored, partitions: Any) -> None:
    """Fill `data.feedback` from (prediction id, outcome, override reason) rows."""
    cards: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for rows in partitions:
        at = data.positions([r[0] for r in rows])
        for row, (pid, outcome, reason) in zip(at, rows, strict=True):
            if row >= 0:
                cards[pid].append((outcome, _reason_text(reason)))
    data.feedback = dict(cards)


def _times(values: list[datetime | None]) -> np.ndarray:
    return np.array([naive_utc(v) for v in values], dtype="datetime64[us]")


def _reason_text(reason: str | None) -> str | None:
    """An override reason as the report shows it: the CDS feedback's reason code (or the
    user's comment), cut to `REASON_CHARS`."""
    return None if reason is None else reason[:REASON_CHARS]
