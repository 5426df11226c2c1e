"""Labels of the ICU tasks: in-ICU mortality and acute-care phenotyping, one row per ICU stay."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import numpy as np

from medtpe.core.meds.events import SubjectEvents
from medtpe.core.meds.labels.phenotypes import phenotypes_of
from medtpe.core.meds.labels.stays import (
    as_datetime,
    death_time,
    diagnoses,
    hospital_stays,
    icu_stays,
)
from medtpe.core.meds.prediction_point import PredictionPoint

MORTALITY_OBSERVATION = timedelta(hours=24)
"""ICU mortality is predicted this long after ICU admission, from the data until then."""
PHENOTYPE_LABEL_SEPARATOR = "|"
"""Phenotype names in a label file's `categorical_value`."""
BEFORE_DIAGNOSES = np.timedelta64(1, "s")
"""A phenotyping prediction time is moved this far before the stay's diagnosis codes when those
are recorded before the ICU discharge (the label must not be part of the record)."""


def icu_mortality(events: SubjectEvents) -> list[PredictionPoint]:
    """Per ICU stay lasting beyond the observation window: death during the stay (up to the ICU
    discharge), predicted `MORTALITY_OBSERVATION` after admission."""
    death = death_time(events)
    window = np.timedelta64(MORTALITY_OBSERVATION)
    rows = []
    for stay in icu_stays(events):
        when = stay.start + window
        if stay.end <= when or (death is not None and death <= when):
            continue
        died = death is not None and death <= stay.end
        rows.append(PredictionPoint(events.subject_id, as_datetime(when), died))
    return rows


def phenotyping(events: SubjectEvents, phenotypes: Sequence[str]) -> list[PredictionPoint]:
    """Per ICU stay inside a hospital stay with diagnoses: the phenotypes of that hospital stay's
    ICD codes, predicted at the ICU discharge (earlier if the diagnoses are recorded earlier)."""
    coded, admissions = diagnoses(events), hospital_stays(events)
    rows = []
    for icu in icu_stays(events):
        hospital = next((h for h in admissions if h.start <= icu.start <= h.end), None)
        if hospital is None:
            continue
        stay_codes = [d for d in coded if hospital.start <= d.time <= hospital.end]
        if not stay_codes:
            continue
        first_code = min(d.time for d in stay_codes)
        when = min(icu.end, first_code - BEFORE_DIAGNOSES)
        if when <= icu.start:
            continue
        names = phenotypes_of(((d.icd_version, d.code) for d in stay_codes), phenotypes)
        rows.append(
            PredictionPoint(
                events.subject_id, as_datetime(when), PHENOTYPE_LABEL_SEPARATOR.join(names)
            )
        )
    return rows
