"""A record in a request body (`service.schemas.PredictRequest`): sorted columns, one subject,
errors that name the event, the hard cap on events."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from medtpe_core.meds import MAX_EVENTS_PER_RECORD, SubjectEvents
from service.schemas import PredictRequest

GOOD = {
    "subject_id": 7,
    "time": "2150-03-01T08:00:00",
    "code": "LAB//220045//bpm",
    "numeric_value": 80,
}


def request(events: list[dict]) -> PredictRequest:
    return PredictRequest.model_validate({"task": "icu_mortality", "events": events})


def error_locs(exc: ValidationError) -> list[tuple]:
    return [e["loc"] for e in exc.errors()]


def test_events_become_sorted_columns():
    late = {**GOOD, "time": "2150-03-02T08:00:00", "code": "late"}
    columns = request([late, {**GOOD, "time": None, "code": "static"}, GOOD]).events
    assert isinstance(columns, SubjectEvents)
    assert list(columns.codes) == ["static", GOOD["code"], "late"]
    assert np.isnat(columns.times[0])


def test_several_subjects_are_refused():
    with pytest.raises(ValidationError, match="same subject_id"):
        request([{**GOOD, "subject_id": 1}, {**GOOD, "subject_id": 2}])


def test_event_errors_carry_the_event_index():
    with pytest.raises(ValidationError) as info:
        request([GOOD, {**GOOD, "time": "not a time"}])
    assert ("events", 1, "time") in error_locs(info.value)


def test_hard_cap_on_event_count():
    with pytest.raises(ValidationError) as info:
        request([GOOD] * (MAX_EVENTS_PER_RECORD + 1))
    assert ("events",) in error_locs(info.value)
    assert str(MAX_EVENTS_PER_RECORD) in str(info.value)
