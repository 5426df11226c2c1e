"""Labels of 30-day readmission: per hospital discharge alive, an unplanned admission within 30
days after it."""

from __future__ import annotations

from datetime import timedelta

import numpy as np

from medtpe.core.meds.events import SubjectEvents
from medtpe.core.meds.labels.stays import admission_type, as_datetime, death_time, hospital_stays
from medtpe.core.meds.prediction_point import PredictionPoint

READMISSION_WINDOW = timedelta(days=30)
PLANNED_ADMISSION_TYPES = frozenset({"ELECTIVE", "SURGICAL SAME DAY ADMISSION"})
"""MIMIC-IV admission types of planned admissions (all others count as unplanned)."""


def readmission_30d(events: SubjectEvents) -> list[PredictionPoint]:
    """Predicted at each discharge of a patient alive then: True when an unplanned hospital
    admission starts in (discharge, discharge + 30 days]."""
    death = death_time(events)
    admissions = hospital_stays(events)
    window = np.timedelta64(READMISSION_WINDOW)
    rows = []
    for stay in admissions:
        if death is not None and death <= stay.end:
            continue
        readmitted = any(
            stay.end < later.start <= stay.end + window
            and admission_type(later) not in PLANNED_ADMISSION_TYPES
            for later in admissions
        )
        rows.append(PredictionPoint(events.subject_id, as_datetime(stay.end), readmitted))
    return rows
