"""The one-pass JSON path (`decode_events`, `medtpe.service.plumbing.json_body.decode_body`) builds
exactly what validating every event as a `MedsEvent` builds, and leaves every body it cannot vouch
for to that path, so answers and errors do not change."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import ValidationError

from medtpe.core.meds.events import MAX_SUBJECT_ID, MedsEvent, SubjectEvents
from medtpe.core.meds.json_events import decode_events
from medtpe.service.plumbing.json_body import decode_body
from medtpe.service.predict.schemas import BatchRequest, PredictRequest
from medtpe.service.predict.tokenize_schemas import TokenizeRequest
from tests.support.service_support import synthetic_events

_TIMES = st.one_of(
    st.none(),
    st.datetimes(datetime(1, 1, 1), datetime(9999, 12, 30)).map(datetime.isoformat),
    st.datetimes(datetime(1900, 1, 1), datetime(2200, 1, 1)).map(
        lambda t: t.isoformat(sep=" ", timespec="minutes")
    ),
    st.sampled_from(
        [
            "2150-01-01T08:00:00Z",
            "2150-01-01T08:00:00+02:00",
            "2150-01-01T08:00:00.000000",
            "2150-02-30T08:00:00",
            "2150-01-01T23:59:60",
            "2150-01-01T24:00:00",
            "0000-01-01T00:00:00",
            "0001-01-01T00:30:00+01:00",
            "9999-12-31T23:00:00-02:00",
            "2150-01-01",
            "2150-13-01T00:00:00",
            "not a time",
        ]
    ),
    st.integers(0, 2**40),
)
_VALUES = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.sampled_from([True, "3.5", 10**400]),
)
_TEXTS = st.one_of(st.none(), st.text(max_size=8), st.integers(0, 3))
_SUBJECTS = st.sampled_from([7, 7, 7, 7, 8, 7.0, True, "7", MAX_SUBJECT_ID + 1, -MAX_SUBJECT_ID])


YEAR_ZERO = [{"subject_id": 7, "time": "0000-01-01T00:00:00", "code": "X"}]
"""An event in the year 0: numpy reads and writes it back alike, `MedsEvent.time` refuses it."""
TWO_SUBJECTS = [
    {"subject_id": 7, "time": None, "code": "X"},
    {"subject_id": 8, "time": None, "code": "X"},
]

_VALID_TIMES = st.one_of(
    st.none(),
    st.datetimes(datetime(2100, 1, 1), datetime(2100, 1, 3)).map(
        lambda t: t.replace(second=0).isoformat()
    ),
)


@st.composite
def json_events(draw: st.DrawFn) -> list[dict]:
    """Events as a client might send them: mostly valid, some fields wrong in every known way
    (each field is drawn from its odd values one time in eight)."""

    def field(valid: st.SearchStrategy, odd: st.SearchStrategy) -> object:
        return draw(odd if not draw(st.integers(0, 7)) else valid)

    events = []
    for _ in range(draw(st.integers(0, 12))):
        event = {
            "subject_id": field(st.just(7), _SUBJECTS),
            "time": field(_VALID_TIMES, _TIMES),
            "code": field(st.sampled_from(["LAB//220045//bpm", "MEDS_BIRTH"]), st.text(max_size=4)),
        }
        if draw(st.booleans()):
            event["numeric_value"] = field(st.floats(-1e6, 1e6) | st.none(), _VALUES)
        if draw(st.booleans()):
            event["text_value"] = field(st.text(max_size=8) | st.none(), _TEXTS)
        if not draw(st.integers(0, 30)):
            event["unit"] = "mg"
        if not draw(st.integers(0, 30)):
            del event["code"]
        events.append(event)
    return events


def slow_path(raw: bytes) -> SubjectEvents | None:
    """Every event validated as a `MedsEvent` (None: invalid, empty or several subjects)."""
    try:
        events = [MedsEvent.model_validate(e) for e in json.loads(raw)]
    except (ValidationError, TypeError, AttributeError):
        return None
    if not events or len({e.subject_id for e in events}) > 1:
        return None
    return SubjectEvents.from_events(events)


def assert_same(fast: SubjectEvents, slow: SubjectEvents) -> None:
    assert fast.subject_id == slow.subject_id
    assert fast.times.dtype == slow.times.dtype
    assert fast.times.view(np.int64).tolist() == slow.times.view(np.int64).tolist()
    assert list(fast.codes) == list(slow.codes)
    assert np.array_equal(fast.numeric_values, slow.numeric_values, equal_nan=True)
    assert list(fast.text_values) == list(slow.text_values)


@given(json_events())
@example(YEAR_ZERO)
@example(TWO_SUBJECTS)
def test_decoded_events_are_the_validated_events_or_none(events: list[dict]) -> None:
    raw = json.dumps(events).encode()
    fast, slow = decode_events(raw), slow_path(raw)
    if fast is not None:
        assert slow is not None
        assert_same(fast, slow)


@pytest.mark.parametrize("n_events", [1, 60, 3000])
@pytest.mark.parametrize("shuffled", [False, True])
def test_a_plain_record_takes_the_fast_path(n_events: int, shuffled: bool) -> None:
    events = synthetic_events(5, n_events)
    if shuffled:
        events = events[::-1]  # the decoder must sort, stably
    events.append({**events[-1], "time": "2150-01-01T08:00:00.250000", "text_value": "a\nb"})
    raw = json.dumps(events).encode()
    fast = decode_events(raw)
    assert fast is not None
    assert_same(fast, slow_path(raw))


def test_offsets_and_other_spellings_are_read_as_the_model_reads_them() -> None:
    t = datetime(2150, 1, 1, 8)
    spellings = ["2150-01-01T10:00:00+02:00", "2150-01-01T08:00:00Z", "2150-01-01 08:00"]
    raw = json.dumps([{"subject_id": 1, "time": s, "code": "X"} for s in spellings]).encode()
    fast = decode_events(raw)
    assert fast is not None
    assert fast.times.astype(object).tolist() == [t, t, t]
    assert_same(fast, slow_path(raw))


def _outcome(model: type, body: object) -> object:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        return [(e["loc"], e["msg"], e["type"]) for e in exc.errors()]


def _comparable(outcome: object) -> object:
    if isinstance(outcome, list):
        return outcome
    data = outcome.model_dump(exclude={"events", "records"})
    records = getattr(outcome, "records", [outcome])
    events = [getattr(r, "events", None) for r in records]
    return data, [
        None if e is None else (e.times.view(np.int64).tolist(), list(e.codes)) for e in events
    ]


@given(
    json_events(),
    st.sampled_from(["icu_mortality", "phenotyping", 3]),
    st.one_of(st.none(), _TIMES),
    st.sampled_from(["predict", "batch", "tokenize", "broken"]),
)
@example(YEAR_ZERO, "icu_mortality", None, "predict")
@example(TWO_SUBJECTS, "icu_mortality", None, "tokenize")
def test_request_bodies_validate_as_with_json_loads(
    events: list[dict], task: object, when: object, shape: str
) -> None:
    record = {"task": task, "events": events}
    if when is not None:
        record["prediction_time"] = when
    model, body = {
        "predict": (PredictRequest, record),
        "batch": (BatchRequest, {"records": [record, {**record, "task": "icu_mortality"}]}),
        "tokenize": (TokenizeRequest, record),
        "broken": (PredictRequest, [record]),
    }[shape]
    raw = json.dumps(body).encode()
    assert _comparable(_outcome(model, decode_body(raw))) == _comparable(
        _outcome(model, json.loads(raw))
    )


def test_malformed_json_raises_what_json_loads_raises() -> None:
    raw = b'{"task": "icu_mortality", "events": [NaN'
    with pytest.raises(json.JSONDecodeError) as fast:
        decode_body(raw)
    with pytest.raises(json.JSONDecodeError) as slow:
        json.loads(raw)
    assert (fast.value.msg, fast.value.pos) == (slow.value.msg, slow.value.pos)


def test_a_nan_value_keeps_its_field_error() -> None:
    event = {"subject_id": 1, "time": None, "code": "X", "numeric_value": float("nan")}
    raw = json.dumps({"task": "icu_mortality", "events": [event]}).encode()
    errors = _outcome(PredictRequest, decode_body(raw))
    assert isinstance(errors, list)
    assert errors[0][0] == ("events", 0, "numeric_value")


def test_request_events_are_columns_either_way() -> None:
    events = synthetic_events(2, 40)
    base = datetime(2150, 1, 1)
    events.append({"subject_id": 2, "time": (base + timedelta(days=9000)).isoformat() + "Z"})
    events[-1]["code"] = "X"
    for body in (decode_body(json.dumps({"task": "t", "events": events}).encode()),):
        assert isinstance(body["events"], SubjectEvents)
        assert isinstance(PredictRequest.model_validate(body).events, SubjectEvents)
    slow = PredictRequest.model_validate({"task": "t", "events": events})
    assert isinstance(slow.events, SubjectEvents)


@pytest.mark.parametrize("read", [decode_body, json.loads], ids=["fast", "json.loads"])
def test_a_time_in_the_year_0_is_refused_at_its_field(read) -> None:
    assert decode_events(json.dumps(YEAR_ZERO).encode()) is None
    raw = json.dumps({"task": "icu_mortality", "events": synthetic_events(7, 3) + YEAR_ZERO})
    errors = _outcome(PredictRequest, read(raw.encode()))
    assert isinstance(errors, list)
    assert [e[0] for e in errors] == [("events", 6, "time")]
    assert "year 0 is out of range" in errors[0][1]


@pytest.mark.parametrize("model", [PredictRequest, TokenizeRequest])
@pytest.mark.parametrize("read", [decode_body, json.loads], ids=["fast", "json.loads"])
def test_several_subjects_are_refused_at_the_first_other_subject_id(read, model) -> None:
    events = synthetic_events(7, 3) + TWO_SUBJECTS
    raw = json.dumps({"task": "icu_mortality", "events": events}).encode()
    errors = _outcome(model, read(raw))
    assert isinstance(errors, list)
    assert [(e[0], e[2]) for e in errors] == [(("events", 7, "subject_id"), "several_subjects")]
