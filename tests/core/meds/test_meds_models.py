"""MEDS event models: validation errors name the field; documented normalisations."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest
from pydantic import ValidationError

from medtpe.core.meds import MedsEvent, SubjectEvents
from tests.support.meds_fixtures import GOOD_EVENT, error_locs, validated_events


def test_valid_event_from_json_and_static_event():
    event = MedsEvent.model_validate_json(
        '{"subject_id": 7, "time": "2150-03-01T08:00:00", "code": "X", '
        '"numeric_value": 1.5, "text_value": "a"}'
    )
    assert (
        event.time == datetime(2150, 3, 1, 8)
        and event.numeric_value == 1.5
        and event.text_value == "a"
    )
    static = MedsEvent(subject_id=7, time=None, code="GENDER//F")
    assert static.time is None and static.numeric_value is None


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"code": None}, ("code",)),
        ({"code": ""}, ("code",)),
        ({"subject_id": "seven"}, ("subject_id",)),
        ({"subject_id": "7"}, ("subject_id",)),  # strict: a string is not an id
        ({"subject_id": 7.5}, ("subject_id",)),
        ({"time": "yesterday"}, ("time",)),
        ({"time": "2150-13-45T00:00:00"}, ("time",)),
        ({"numeric_value": "high"}, ("numeric_value",)),
        ({"numeric_value": math.nan}, ("numeric_value",)),
        ({"numeric_value": math.inf}, ("numeric_value",)),
        ({"numeric_value": -math.inf}, ("numeric_value",)),
        ({"text_value": 5}, ("text_value",)),
    ],
)
def test_bad_fields_name_the_field(change, loc):
    with pytest.raises(ValidationError) as info:
        MedsEvent.model_validate({**GOOD_EVENT, **change})
    assert loc in error_locs(info.value)


@pytest.mark.parametrize("field", ["subject_id", "time", "code"])
def test_missing_required_field(field):
    data = {k: v for k, v in GOOD_EVENT.items() if k != field}
    with pytest.raises(ValidationError) as info:
        MedsEvent.model_validate(data)
    assert (field,) in error_locs(info.value)


def test_non_finite_in_json_body():
    with pytest.raises(ValidationError) as info:
        MedsEvent.model_validate_json(
            '{"subject_id": 1, "time": null, "code": "A", "numeric_value": NaN}'
        )
    assert ("numeric_value",) in error_locs(info.value)


def test_timezone_aware_time_becomes_naive_utc():
    event = MedsEvent(
        subject_id=1, time=datetime(2150, 1, 1, 10, tzinfo=timezone(timedelta(hours=2))), code="A"
    )
    assert event.time == datetime(2150, 1, 1, 8) and event.time.tzinfo is None
    assert (
        MedsEvent(subject_id=1, time=datetime(2150, 1, 1, tzinfo=UTC), code="A").time.tzinfo is None
    )


def test_record_sorts_events_stably_static_first():
    events = [
        {"subject_id": 1, "time": "2150-01-02T00:00:00", "code": "late"},
        {"subject_id": 1, "time": "2150-01-01T00:00:00", "code": "early-1"},
        {"subject_id": 1, "time": None, "code": "static"},
        {"subject_id": 1, "time": "2150-01-01T00:00:00", "code": "early-2"},
        {
            "subject_id": 1,
            "time": "2150-01-01T00:00:00",
            "code": "early-1",
        },  # exact duplicate: kept
    ]
    columns = SubjectEvents.from_events(validated_events(events))
    assert list(columns.codes) == ["static", "early-1", "early-2", "early-1", "late"]
    assert np.isnat(columns.times[0]) and len(columns) == 5


def test_extra_event_fields_are_accepted_and_ignored():
    # MEDS allows further columns (e.g. a unit, an admission id); they do not reach the model
    event = MedsEvent.model_validate({**GOOD_EVENT, "hadm_id": 27882036, "unit": "bpm"})
    assert event == MedsEvent.model_validate(GOOD_EVENT)
    assert "hadm_id" not in event.model_dump()


def test_subject_events_up_to_and_including_prediction_time():
    events = SubjectEvents.from_events(
        [
            MedsEvent(subject_id=1, time=None, code="static"),
            MedsEvent(subject_id=1, time=datetime(2150, 1, 1, 9, 59), code="before"),
            MedsEvent(subject_id=1, time=datetime(2150, 1, 1, 10), code="at"),
            MedsEvent(subject_id=1, time=datetime(2150, 1, 1, 11), code="after"),
        ]
    )
    cut = datetime(2150, 1, 1, 10)
    assert list(events.before(cut).codes) == ["static", "before", "at"]
    assert list(events.before(cut, inclusive=False).codes) == ["static", "before"]


def test_models_work_as_fastapi_request_bodies():
    fastapi = pytest.importorskip("fastapi")
    testclient = pytest.importorskip("fastapi.testclient")
    app = fastapi.FastAPI()

    @app.post("/echo")
    def echo(events: list[MedsEvent]) -> dict:
        return {"n": len(events)}

    client = testclient.TestClient(app)
    assert client.post("/echo", json=[GOOD_EVENT]).json() == {"n": 1}
    extra = client.post("/echo", json=[{**GOOD_EVENT, "hadm_id": 1, "unit": "bpm"}])
    assert extra.status_code == 200 and extra.json() == {"n": 1}
    response = client.post("/echo", json=[{**GOOD_EVENT, "numeric_value": "high"}])
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", 0, "numeric_value"]
