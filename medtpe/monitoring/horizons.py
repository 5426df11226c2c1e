"""When a task's outcome is known: the prediction time plus the task's horizon, or the end of the
stay its labeller reads (ICU mortality: death up to the ICU discharge).

The horizons are the labellers' own windows (`medtpe.core.meds.labels`), so an outcome is joined
exactly as a label file of the task is derived."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import numpy as np

from medtpe.core.meds.events import SubjectEvents
from medtpe.core.meds.labels.icu import MORTALITY_OBSERVATION
from medtpe.core.meds.labels.pancreatic_cancer import CANCER_WINDOW
from medtpe.core.meds.labels.readmission import READMISSION_WINDOW
from medtpe.core.meds.labels.stays import (
    CODE_SEPARATOR,
    ICU_ADMISSION,
    ICU_DISCHARGE,
    as_datetime,
    icu_stays,
)

HorizonEnd = Callable[[SubjectEvents, datetime], datetime | None]
"""(the subject's events, a prediction time) -> when its outcome is known (None: not yet known
in these events)."""


def _after(window: timedelta) -> HorizonEnd:
    """The horizon `window` after the prediction time."""

    def horizon_end(_events: SubjectEvents, prediction_time: datetime) -> datetime | None:
        return prediction_time + window

    return horizon_end


def icu_stay_end(events: SubjectEvents, prediction_time: datetime) -> datetime | None:
    """The discharge of the ICU stay open at `prediction_time` (None: none closed yet). A
    prediction outside every closed stay is known at once (its label, if any, is none)."""
    when = np.datetime64(prediction_time, "us")
    for stay in icu_stays(events):
        if stay.start <= when <= stay.end:
            return as_datetime(stay.end)
    if _open_icu_stay(events, when):
        return None
    return prediction_time


def _open_icu_stay(events: SubjectEvents, when: np.datetime64) -> bool:
    """Whether an ICU admission at or before `when` has no discharge after it."""
    admitted = None
    for time, code in zip(events.times, events.codes, strict=True):
        kind = code.split(CODE_SEPARATOR, 1)[0]
        if np.isnat(time):
            continue
        if kind == ICU_ADMISSION and time <= when:
            admitted = time
        elif kind == ICU_DISCHARGE and admitted is not None and time >= admitted:
            admitted = None
    return admitted is not None


HORIZONS: dict[str, HorizonEnd] = {
    "icu_mortality": icu_stay_end,
    "readmission_30d": _after(READMISSION_WINDOW),
    "pancreatic_cancer_1y": _after(CANCER_WINDOW),
}
"""The binary tasks whose outcomes can be joined, by name."""

HORIZON_TEXT = {
    "icu_mortality": (
        f"death during the ICU stay, known at the ICU discharge (predicted "
        f"{MORTALITY_OBSERVATION.total_seconds() / 3600:g} h after admission)"
    ),
    "readmission_30d": f"an unplanned admission within {READMISSION_WINDOW.days} days",
    "pancreatic_cancer_1y": f"a first pancreatic cancer diagnosis within {CANCER_WINDOW.days} days",
}
"""What each task's outcome is and when it is known, for the report."""


def horizon_of(task: str) -> HorizonEnd:
    """The horizon of `task`; ValueError for a task whose outcome cannot be joined."""
    if task not in HORIZONS:
        raise ValueError(
            f"task {task!r}: outcomes are joined for {', '.join(HORIZONS)} (binary tasks with a "
            "labeller)"
        )
    return HORIZONS[task]
