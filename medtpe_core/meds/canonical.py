"""A record's canonical form: the events a prediction may read, as bytes that equal records
always give the same way, so their SHA-256 identifies the record (a prediction's receipt).

The form is compact JSON (UTF-8, keys sorted, no spaces) of
`{"descriptions": {code: text}, "events": [[time, code, numeric_value, text_value], ...],
"prediction_time": time, "subject_id": id}`: the events up to and including the prediction time,
in the order the renderer reads them (by time, static events first, ties in input order); times
as naive-UTC ISO 8601 with microseconds (`2020-01-01T08:00:00.000000`), static ones null;
numbers by Python's `repr` (the shortest text that reads back to the same float), missing null;
`descriptions` the record's own code descriptions (a FHIR record's display texts; `{}` for MEDS
events). `parse_canonical_record` reads the form back into the same events.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import numpy as np

from medtpe_core.meds.events import SubjectEvents, to_naive_utc

_TIME_UNIT = "us"


def canonical_record(
    events: SubjectEvents,
    prediction_time: datetime | None,
    descriptions: Mapping[str, str] | None = None,
) -> bytes:
    """The canonical bytes of `events` read at `prediction_time` (None: every event)."""
    seen = events if prediction_time is None else events.before(prediction_time)
    texts = np.datetime_as_string(seen.times.astype(f"datetime64[{_TIME_UNIT}]"), unit=_TIME_UNIT)
    times = np.where(np.isnat(seen.times), None, texts.astype(object)).tolist()
    values = seen.numeric_values
    numbers = np.where(np.isnan(values), None, values.astype(object)).tolist()
    rows = list(zip(times, seen.codes, numbers, seen.text_values, strict=True))
    when = None if prediction_time is None else _iso(to_naive_utc(prediction_time))
    document = {
        "descriptions": dict(descriptions or {}),
        "events": rows,
        "prediction_time": when,
        "subject_id": events.subject_id,
    }
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def record_digest(canonical: bytes) -> str:
    """SHA-256 (hex) of a record's canonical bytes."""
    return hashlib.sha256(canonical).hexdigest()


def parse_canonical_record(
    canonical: bytes | str,
) -> tuple[SubjectEvents, datetime | None, dict[str, str]]:
    """The events, prediction time and descriptions of a record's canonical form."""
    document: dict[str, Any] = json.loads(canonical)
    rows = document["events"]
    times = np.array(
        [np.datetime64("NaT") if row[0] is None else np.datetime64(row[0]) for row in rows],
        dtype=f"datetime64[{_TIME_UNIT}]",
    )
    events = SubjectEvents(
        subject_id=int(document["subject_id"]),
        times=times,
        codes=[row[1] for row in rows],
        numeric_values=np.array(
            [math.nan if row[2] is None else float(row[2]) for row in rows], dtype=np.float64
        ),
        text_values=[row[3] for row in rows],
    )
    when = document["prediction_time"]
    return events, None if when is None else datetime.fromisoformat(when), document["descriptions"]


def _iso(value: datetime) -> str:
    return value.isoformat(timespec="microseconds")
