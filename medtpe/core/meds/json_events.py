"""A JSON array of MEDS events straight into columns (`SubjectEvents`), without one pydantic model
per event.

`decode_events(raw)` decodes with msgspec (C) into light structs whose fields are at least as
strict as `MedsEvent`'s, validates each distinct time string with `MedsEvent`'s own time type and
the rest column by column. It answers the very `SubjectEvents` that validating every event as a
`MedsEvent` and `SubjectEvents.from_events` would, or None whenever it cannot vouch for that (a
shape or a value outside its strict subset, any invalid event, several subjects, an empty or
oversized record): the caller then validates the slow way, which also words the error.
"""

from __future__ import annotations

import re
from datetime import datetime
from operator import attrgetter

import msgspec
import numpy as np
from pydantic import TypeAdapter, ValidationError

from medtpe.core.meds.events import (
    MAX_EVENTS_PER_RECORD,
    MAX_SUBJECT_ID,
    IsoTime,
    SubjectEvents,
    datetimes_to_array,
)


class _JsonEvent(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """One event as msgspec checks it: JSON integers, strings and numbers only (no coercion)."""

    subject_id: int
    time: str | None
    code: str
    numeric_value: float | None = None
    text_value: str | None = None


_DECODER = msgspec.json.Decoder(list[_JsonEvent])
_SUBJECT, _TIME, _CODE = attrgetter("subject_id"), attrgetter("time"), attrgetter("code")
_VALUE, _TEXT = attrgetter("numeric_value"), attrgetter("text_value")
_TIMES = TypeAdapter(list[IsoTime])
_CANONICAL = re.compile(
    r"(?!0000)[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{6})?"
)
"""Naive ISO 8601 with seconds (and microseconds) in the years 1-9999: what numpy and
`MedsEvent.time` read alike (numpy also reads the year 0, which `MedsEvent.time` refuses)."""


def decode_events(raw: bytes | memoryview) -> SubjectEvents | None:
    """The events of the JSON array `raw` as sorted columns, or None when the slow path (one
    `MedsEvent` per event) must decide (see the module docstring)."""
    try:
        events = _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not 0 < len(events) <= MAX_EVENTS_PER_RECORD:
        return None
    subjects = set(map(_SUBJECT, events))
    subject_id = subjects.pop()
    if subjects or abs(subject_id) > MAX_SUBJECT_ID:
        return None
    codes = list(map(_CODE, events))
    if not all(codes):  # an empty code
        return None
    values = np.array(list(map(_VALUE, events)), dtype=np.float64)  # None: NaN
    if np.isinf(values).any():  # a number too large for a float
        return None
    times = _times(list(map(_TIME, events)))
    if times is None:
        return None
    return SubjectEvents.from_columns(subject_id, times, codes, values, list(map(_TEXT, events)))


def _times(strings: list[str | None]) -> np.ndarray | None:
    """datetime64[us] of each time string (NaT for null), each distinct string read once: as
    numpy reads it when it is in the canonical naive form (`YYYY-MM-DDTHH:MM:SS[.ffffff]`, which
    `MedsEvent.time` reads the same), else as `MedsEvent.time` validates it; None if one is
    invalid."""
    distinct = [s for s in dict.fromkeys(strings) if s is not None]
    table = np.empty(len(distinct) + 1, dtype="datetime64[us]")  # [0]: null
    table[0] = np.datetime64("NaT")
    canonical, values = _canonical(distinct)
    table[1:][canonical] = values
    others = [s for s, c in zip(distinct, canonical, strict=True) if not c]
    if others:
        try:
            parsed: list[datetime] = _TIMES.validate_python(others)
        except ValidationError:
            return None
        table[1:][~canonical] = datetimes_to_array(parsed)
    index: dict[str | None, int] = dict(zip(distinct, range(1, len(distinct) + 1), strict=True))
    index[None] = 0
    return table[np.array(list(map(index.__getitem__, strings)), dtype=np.intp)]


def _canonical(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Which strings are valid times in the canonical naive form, and their values: numpy reads
    them and must write them back the same (so an impossible date or a leap second is not
    canonical; the year 0, which numpy writes back alike, is kept out by `_CANONICAL`)."""
    shaped = np.array([_CANONICAL.fullmatch(s) is not None for s in strings], dtype=bool)
    if not shaped.any():
        return shaped, np.empty(0, dtype="datetime64[us]")
    candidates = np.array(
        [s if len(s) == 26 else s + ".000000" for s, ok in zip(strings, shaped, strict=True) if ok]
    )
    try:
        parsed = candidates.astype("datetime64[us]")
    except ValueError:  # one is not a date at all: leave them all to the validator
        return np.zeros(len(strings), dtype=bool), np.empty(0, dtype="datetime64[us]")
    ok = np.datetime_as_string(parsed, unit="us") == candidates
    shaped[shaped] = ok
    return shaped, parsed[ok]
