"""Labels of 1-year pancreatic cancer: per hospital discharge of a patient without a pancreatic
cancer diagnosis up to then, a first diagnosis within the following year."""

from __future__ import annotations

from datetime import timedelta

import numpy as np

from medtpe.core.meds.events import SubjectEvents
from medtpe.core.meds.labels.stays import (
    Diagnosis,
    as_datetime,
    death_time,
    diagnoses,
    hospital_stays,
    last_time,
)
from medtpe.core.meds.prediction_point import PredictionPoint

CANCER_WINDOW = timedelta(days=365)
PANCREATIC_CANCER_PREFIXES = {"9": ("157",), "10": ("C25",)}
"""ICD-9 157.* and ICD-10 C25.* (malignant neoplasm of pancreas), by ICD version."""


def is_pancreatic_cancer(diagnosis: Diagnosis) -> bool:
    """Whether a diagnosis is a malignant neoplasm of the pancreas."""
    return diagnosis.code.startswith(PANCREATIC_CANCER_PREFIXES.get(diagnosis.icd_version, ()))


def pancreatic_cancer_1y(events: SubjectEvents) -> list[PredictionPoint]:
    """Predicted at each hospital discharge with no pancreatic cancer diagnosis at or before it:
    True when one follows within a year. A negative record needs the year observed (an event a
    year later or more, or death within the year); otherwise it is left out (censored)."""
    first = next((d.time for d in diagnoses(events) if is_pancreatic_cancer(d)), None)
    death, last = death_time(events), last_time(events)
    window = np.timedelta64(CANCER_WINDOW)
    rows = []
    for stay in hospital_stays(events):
        when = stay.end
        if first is not None and first <= when:
            continue
        positive = first is not None and first <= when + window
        observed = (last is not None and last >= when + window) or (
            death is not None and death <= when + window
        )
        if positive or observed:
            rows.append(PredictionPoint(events.subject_id, as_datetime(when), positive))
    return rows
