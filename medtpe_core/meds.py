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

Errors: a missing or wrongly typed field, an unparseable time, a non-finite `numeric_value`
(NaN/inf), more than `MAX_EVENTS_PER_RECORD` events or several subjects
in one record each raise a pydantic `ValidationError` whose `loc` names the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

MAX_EVENTS_PER_RECORD = 200_000
"""Hard cap on the events of one record sent as JSON (a larger body is rejected, not truncated)."""

FiniteFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class MedsEvent(BaseModel):
    """One MEDS event; usable as (part of) a FastAPI request body. Extra fields are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    subject_id: StrictInt
    time: datetime | None = Field(description="event time; null for static events")
    code: StrictStr = Field(min_length=1)
    numeric_value: FiniteFloat | None = None
    text_value: StrictStr | None = None

    @field_validator("time")
    @classmethod
    def _naive_utc(cls, value: datetime | None) -> datetime | None:
        return to_naive_utc(value) if value is not None else None


class MedsRecord(BaseModel):
    """The events of one subject, as a request body: `{"events": [MedsEvent, ...]}`."""

    model_config = ConfigDict(extra="forbid")

    events: list[MedsEvent] = Field(max_length=MAX_EVENTS_PER_RECORD)  # shown in the JSON schema

    @field_validator("events", mode="before")
    @classmethod
    def _cap_before_validation(cls, events: object) -> object:
        # fail fast: do not validate a huge body event by event before rejecting it
        if isinstance(events, list) and len(events) > MAX_EVENTS_PER_RECORD:
            raise ValueError(
                f"at most {MAX_EVENTS_PER_RECORD} events per record, got {len(events)}"
            )
        return events

    @field_validator("events")
    @classmethod
    def _one_subject(cls, events: list[MedsEvent]) -> list[MedsEvent]:
        subjects = {event.subject_id for event in events}
        if len(subjects) > 1:
            raise ValueError(
                f"events of one subject expected, got subject_ids {sorted(subjects)[:5]}"
            )
        return events

    def to_subject_events(self) -> SubjectEvents:
        """Columnar, time-sorted view of these events."""
        return SubjectEvents.from_events(self.events)


def to_naive_utc(value: datetime) -> datetime:
    """Naive UTC datetime (timezone-aware values are converted, naive ones kept)."""
    if value.tzinfo is None:
        return value
    return value.astimezone(UTC).replace(tzinfo=None)


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
        subject_id = events[0].subject_id if events else 0
        times = np.array(
            [
                np.datetime64(e.time, "us") if e.time is not None else np.datetime64("NaT")
                for e in events
            ],
            dtype="datetime64[us]",
        )
        values = np.array(
            [e.numeric_value if e.numeric_value is not None else np.nan for e in events],
            dtype=np.float64,
        )
        order = time_order(times)
        return cls(
            subject_id=subject_id,
            times=times[order],
            codes=[events[i].code for i in order],
            numeric_values=values[order],
            text_values=[events[i].text_value for i in order],
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
        `inclusive=False`."""
        cutoff = np.datetime64(to_naive_utc(prediction_time), "us")
        kept = self.times <= cutoff if inclusive else self.times < cutoff
        return self.take(np.isnat(self.times) | kept)


def time_order(times: np.ndarray) -> np.ndarray:
    """Stable sort order by time with NaT (static events) first."""
    keys = times.astype("int64")  # NaT is the smallest int64, so static events sort first
    return np.argsort(keys, kind="stable")
