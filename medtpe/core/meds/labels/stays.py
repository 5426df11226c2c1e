"""Hospital and ICU stays, diagnoses and deaths read from a subject's MEDS events.

Code conventions are those of the MIMIC-IV MEDS ETL (`MIMIC_IV_MEDS`): a stay opens with a
`HOSPITAL_ADMISSION//<admission type>//<location>` or `ICU_ADMISSION//<unit>` event and closes with
the next `HOSPITAL_DISCHARGE//...` / `ICU_DISCHARGE//...`; diagnoses are
`DIAGNOSIS//ICD//<9|10>//<code without dot>`; death is the MEDS `MEDS_DEATH` code.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import meds
import numpy as np

from medtpe.core.meds.events import SubjectEvents

CODE_SEPARATOR = "//"
HOSPITAL_ADMISSION = "HOSPITAL_ADMISSION"
HOSPITAL_DISCHARGE = "HOSPITAL_DISCHARGE"
ICU_ADMISSION = "ICU_ADMISSION"
ICU_DISCHARGE = "ICU_DISCHARGE"
DIAGNOSIS_ICD = "DIAGNOSIS//ICD//"
"""Prefix of a diagnosis code; the ICD version and the code follow."""


@dataclass(frozen=True)
class Stay:
    """One admission: from its opening to its closing event, and the opening event's code."""

    start: np.datetime64
    end: np.datetime64
    start_code: str


@dataclass(frozen=True)
class Diagnosis:
    """One ICD diagnosis event."""

    time: np.datetime64
    icd_version: str
    code: str


def _kind(code: str) -> str:
    return code.split(CODE_SEPARATOR, 1)[0]


def stays(events: SubjectEvents, opening: str, closing: str) -> list[Stay]:
    """Stays from `opening` to the next `closing` event (codes compared on their first part); an
    opening event without a closing one before the next opening is dropped."""
    found, open_at, open_code = [], None, ""
    for time, code in zip(events.times, events.codes, strict=True):
        if np.isnat(time):
            continue
        kind = _kind(code)
        if kind == opening:
            open_at, open_code = time, code
        elif kind == closing and open_at is not None:
            found.append(Stay(open_at, time, open_code))
            open_at = None
    return found


def hospital_stays(events: SubjectEvents) -> list[Stay]:
    """The subject's hospital admissions."""
    return stays(events, HOSPITAL_ADMISSION, HOSPITAL_DISCHARGE)


def icu_stays(events: SubjectEvents) -> list[Stay]:
    """The subject's ICU stays."""
    return stays(events, ICU_ADMISSION, ICU_DISCHARGE)


def admission_type(stay: Stay) -> str:
    """The admission type of a hospital stay (second part of its opening code; '' if none)."""
    parts = stay.start_code.split(CODE_SEPARATOR)
    return parts[1] if len(parts) > 1 else ""


def diagnoses(events: SubjectEvents) -> list[Diagnosis]:
    """The subject's timed ICD diagnoses, in time order."""
    found = []
    for time, code in zip(events.times, events.codes, strict=True):
        if np.isnat(time) or not code.startswith(DIAGNOSIS_ICD):
            continue
        version, _, icd = code[len(DIAGNOSIS_ICD) :].partition(CODE_SEPARATOR)
        if icd:
            found.append(Diagnosis(time, version, icd))
    return found


def death_time(events: SubjectEvents) -> np.datetime64 | None:
    """Time of the subject's first `MEDS_DEATH` event, None if none."""
    for time, code in zip(events.times, events.codes, strict=True):
        if code == meds.death_code and not np.isnat(time):
            return time
    return None


def last_time(events: SubjectEvents) -> np.datetime64 | None:
    """Time of the subject's last timed event (None without any)."""
    timed = events.times[~np.isnat(events.times)]
    return timed.max() if timed.size else None


def as_datetime(time: np.datetime64) -> datetime:
    """A numpy time as a naive `datetime` (microseconds)."""
    return time.astype("datetime64[us]").item()
