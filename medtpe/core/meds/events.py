"""MEDS events: pydantic models for request bodies and a columnar per-subject view for rendering.

Field names follow the MEDS standard (`subject_id`, `time`, `code`, `numeric_value`,
`text_value`); static events have `time = None`.

Normalisations (documented, tested):
- events are sorted by time, static events first; events sharing a timestamp keep their input
  order (stable sort), so the result is deterministic;
- timezone-aware times are converted to UTC and made naive (MEDS times are naive);
- exact duplicate events are kept here (no data is dropped); the renderer shows them once with a
  count (``×2``).

Extra fields of an event (MEDS allows further columns) are accepted and ignored.

Errors: a missing or wrongly typed field, an unparseable time or a non-finite `numeric_value`
(NaN/inf) raise a pydantic `ValidationError` whose `loc` names the field. The record-level
rules (at most `MAX_EVENTS_PER_RECORD` events, one subject) belong to the request body
(`medtpe.service.predict.schemas.PredictRequest`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
)

MAX_EVENTS_PER_RECORD = 200_000
"""Hard cap on the events of one record sent as JSON (a larger body is rejected, not truncated)."""

MAX_SUBJECT_ID = 2**53 - 1
"""Largest subject id accepted: the integers every JSON parser keeps exact (RFC 8259 §6)."""

_TIME_DTYPE = np.dtype("datetime64[us]")
_NAT_KEY = np.iinfo(np.int64).min
"""`NaT` (a static event's time) as int64: smaller than every time, so static events sort first."""

FiniteFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]


def _not_a_number(value: object) -> object:
    if isinstance(value, int | float):
        raise ValueError("a time is an ISO 8601 string, not a number")
    return value


IsoTime = Annotated[
    datetime, BeforeValidator(_not_a_number), AfterValidator(lambda t: to_naive_utc(t))
]
"""A time given as an ISO 8601 string (or a `datetime`), kept as naive UTC (MEDS times are
naive; an offset is converted); numbers are refused."""


def _a_number(value: object) -> object:
    if isinstance(value, str | bool):
        raise ValueError("a JSON number is expected")
    return value


JsonInt = Annotated[int, BeforeValidator(_a_number)]
"""An integer as JSON Schema has it: `3` or `3.0`, never `"3"`, `true` or `3.5`."""


class MedsEvent(BaseModel):
    """One MEDS event; usable as (part of) a FastAPI request body. Extra fields are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    subject_id: JsonInt = Field(
        ge=-MAX_SUBJECT_ID, le=MAX_SUBJECT_ID, description="MEDS subject id (JSON-safe integer)"
    )
    time: IsoTime | None = Field(
        description="Event time (ISO 8601; naive = UTC, an offset is converted to UTC and must "
        "stay within the years 1–9999); null for static events."
    )
    code: StrictStr = Field(min_length=1)
    numeric_value: FiniteFloat | None = None
    text_value: StrictStr | None = None


def to_naive_utc(value: datetime) -> datetime:
    """Naive UTC datetime (timezone-aware values are converted, naive ones kept); a ValueError
    when the conversion leaves the years 1–9999."""
    if value.tzinfo is None:
        return value
    try:
        return value.astimezone(UTC).replace(tzinfo=None)
    except OverflowError as exc:
        raise ValueError(f"{value.isoformat()} is out of range in UTC") from exc


@dataclass(frozen=True)
class SubjectEvents:
    """Events of one subject as columns, sorted by time (static events, `NaT`, first).

    `numeric_values` holds NaN where an event has no numeric value: inputs are validated finite,
    so NaN here only ever means "missing".
    """

    subject_id: int
    times: np.ndarray  # datetime64[us], NaT for static events
    codes: Sequence[str]
    numeric_values: np.ndarray  # float64, NaN = no value
    text_values: Sequence[str | None]

    def __post_init__(self) -> None:
        n = len(self.codes)
        if not (len(self.times) == len(self.numeric_values) == len(self.text_values) == n):
            raise ValueError("SubjectEvents columns must have the same length")

    def __len__(self) -> int:
        return len(self.codes)

    @classmethod
    def from_events(cls, events: Sequence[MedsEvent]) -> SubjectEvents:
        """Build from validated events, sorting them by time (stable, static events first)."""
        return cls.from_columns(
            events[0].subject_id if events else 0,
            datetimes_to_array([e.time for e in events]),
            [e.code for e in events],
            np.array([e.numeric_value for e in events], dtype=np.float64),  # None -> NaN
            [e.text_value for e in events],
        )

    @classmethod
    def from_columns(
        cls,
        subject_id: int,
        times: np.ndarray,
        codes: list[str],
        numeric_values: np.ndarray,
        text_values: list[str | None],
    ) -> SubjectEvents:
        """Build from validated columns in input order, sorting them by time (stable, static
        events first); columns already in order are kept as they are."""
        keys = time_keys(times)
        if keys.size < 2 or bool((keys[1:] >= keys[:-1]).all()):
            return cls(subject_id, times, codes, numeric_values, text_values)
        order = time_order(times)
        return cls(
            subject_id=subject_id,
            times=times[order],
            codes=[codes[i] for i in order.tolist()],
            numeric_values=numeric_values[order],
            text_values=[text_values[i] for i in order.tolist()],
        )

    def take(self, mask: np.ndarray) -> SubjectEvents:
        """The events where `mask` is true, order kept."""
        index = np.flatnonzero(mask)
        return SubjectEvents(
            subject_id=self.subject_id,
            times=self.times[index],
            codes=[self.codes[i] for i in index],
            numeric_values=self.numeric_values[index],
            text_values=[self.text_values[i] for i in index],
        )

    def before(self, prediction_time: datetime, *, inclusive: bool = True) -> SubjectEvents:
        """Static events and the events up to and including `prediction_time` (MEDS: data "up
        to and including" the prediction time may be used), or strictly before it with
        `inclusive=False`.

        The events are sorted with static ones first, so these are a prefix (a slice, no copy
        of the columns event by event)."""
        cutoff = np.datetime64(to_naive_utc(prediction_time), "us").astype(np.int64)
        side = "right" if inclusive else "left"
        end = int(np.searchsorted(time_keys(self.times), cutoff, side=side))
        if end == len(self):
            return self
        return SubjectEvents(
            subject_id=self.subject_id,
            times=self.times[:end],
            codes=self.codes[:end],
            numeric_values=self.numeric_values[:end],
            text_values=self.text_values[:end],
        )

    def last_time(self) -> datetime | None:
        """The time of the newest timed event (None when every event is static)."""
        if not len(self) or np.isnat(self.times[-1]):
            return None
        return self.times[-1].astype("datetime64[us]").item()

    @property
    def n_static(self) -> int:
        """Number of static events (they come first)."""
        return int(np.searchsorted(time_keys(self.times), _NAT_KEY, side="right"))


def datetimes_to_array(values: Sequence[datetime | None]) -> np.ndarray:
    """datetime64[us] of naive datetimes (NaT for None), each distinct value converted once
    (through its ISO string: numpy converts `datetime` objects one slow call at a time)."""
    distinct = list(dict.fromkeys(values))
    table = np.array(
        [v.isoformat() if v is not None else "NaT" for v in distinct], dtype=_TIME_DTYPE
    )
    if len(distinct) == len(values):
        return table
    index = {v: i for i, v in enumerate(distinct)}
    return table[np.array([index[v] for v in values], dtype=np.intp)]


def time_keys(times: np.ndarray) -> np.ndarray:
    """Times as int64 microseconds (no copy for datetime64[us]); NaT is the smallest int64."""
    if times.dtype != _TIME_DTYPE:
        times = times.astype(_TIME_DTYPE)
    return times.view(np.int64)


def time_order(times: np.ndarray) -> np.ndarray:
    """Stable sort order by time with NaT (static events) first."""
    return np.argsort(time_keys(times), kind="stable")
