"""A record in a request body (`medtpe.service.predict.schemas.PredictRequest`): sorted columns, one
subject, errors that name the event, the hard cap on events."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from medtpe.core.meds.events import MAX_EVENTS_PER_RECORD, SubjectEvents
from medtpe.service.predict.schemas import PredictRequest
from tests.support.meds_fixtures import GOOD_EVENT, error_locs


def request(events: list[dict]) -> PredictRequest:
    return PredictRequest.model_validate({"task": "icu_mortality", "events": events})


def test_events_become_sorted_columns():
    late = {**GOOD_EVENT, "time": "2150-03-02T08:00:00", "code": "late"}
    columns = request([late, {**GOOD_EVENT, "time": None, "code": "static"}, GOOD_EVENT]).events
    assert isinstance(columns, SubjectEvents)
    assert list(columns.codes) == ["static", GOOD_EVENT["code"], "late"]
    assert np.isnat(columns.times[0])


def test_several_subjects_are_refused():
    with pytest.raises(ValidationError, match="same subject_id"):
        request([{**GOOD_EVENT, "subject_id": 1}, {**GOOD_EVENT, "subject_id": 2}])


def test_event_errors_carry_the_event_index():
    with pytest.raises(ValidationError) as info:
        request([GOOD_EVENT, {**GOOD_EVENT, "time": "not a time"}])
    assert ("events", 1, "time") in error_locs(info.value)


def test_hard_cap_on_event_count():
    with pytest.raises(ValidationError) as info:
        request([GOOD_EVENT] * (MAX_EVENTS_PER_RECORD + 1))
    assert ("events",) in error_locs(info.value)
    assert str(MAX_EVENTS_PER_RECORD) in str(info.value)
