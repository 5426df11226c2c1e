"""Data-to-text rendering: order, grouping, descriptions, leakage, and the token budget."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import numpy as np
import pytest

from medtpe.core.meds import MedsDataset, MedsEvent, SubjectEvents
from medtpe.core.prompt.render import (
    BudgetTooSmallError,
    describe_code,
    format_value,
    render_record,
)
from tests.support.meds_fixtures import (
    DESCRIPTIONS,
    PREDICTION_TIME,
    T0,
    train_tokenizer,
    write_meds_dataset,
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return MedsDataset.load(write_meds_dataset(tmp_path_factory.mktemp("meds")))


@pytest.fixture(scope="module")
def encoder(dataset):
    return train_tokenizer([render_record(s, dataset.descriptions).text for s in dataset])


def events_of(*specs):
    """SubjectEvents from (time | None, code, value, text) tuples."""
    return SubjectEvents.from_events(
        [
            MedsEvent(subject_id=1, time=t, code=c, numeric_value=v, text_value=x)
            for t, c, v, x in specs
        ]
    )


def test_chronological_grouped_by_timestamp_with_dates_on_change():
    events = events_of(
        (datetime(2150, 1, 2, 9, 0), "LAB//220045//bpm", 90.0, None),
        (datetime(2150, 1, 1, 8, 0), "LAB//220045//bpm", 80.0, None),
        (None, "GENDER//F", None, None),
        (datetime(2150, 1, 1, 8, 0), "LAB//50912//mg/dL", 1.25, None),
        (datetime(2150, 1, 1, 9, 30, 15), "LAB//220045//bpm", 85.0, None),
    )
    text = render_record(events, DESCRIPTIONS).text
    assert text.splitlines() == [
        "[static]",
        "Gender: F",
        "[2150-01-01 08:00]",
        "Heart Rate: 80 bpm",
        "Creatinine (Blood): 1.25 mg/dL",
        "[09:30:15]",
        "Heart Rate: 85 bpm",
        "[2150-01-02 09:00]",
        "Heart Rate: 90 bpm",
    ]


def test_exact_duplicates_are_shown_once_with_a_count():
    t = datetime(2150, 1, 1, 8)
    events = events_of(
        (t, "LAB//220045//bpm", 80.0, None),
        (t, "LAB//220045//bpm", 80.0, None),
        (t, "LAB//220045//bpm", 81.0, None),
    )
    record = render_record(events, DESCRIPTIONS)
    assert record.text.splitlines()[1:] == ["Heart Rate: 80 bpm (x2)", "Heart Rate: 81 bpm"]
    assert record.n_events_total == record.n_events_kept == 3


def test_lines_of_one_instant_are_ordered_by_code_then_line():
    t = datetime(2150, 1, 1, 8)
    events = events_of(
        (None, "RACE//WHITE", None, None),
        (None, "GENDER//F", None, None),
        (t, "LAB//50912//mg/dL", 1.25, None),
        (t, "LAB//220045//bpm", 90.0, None),
        (t, "DIAGNOSIS//ICD//9//4019", None, None),
        (t, "LAB//220045//bpm", 100.0, None),
    )
    assert render_record(events, DESCRIPTIONS).text.splitlines() == [
        "[static]",
        "Gender: F",
        "Race: WHITE",
        "[2150-01-01 08:00]",
        "Diagnosis: Unspecified essential hypertension",
        "Heart Rate: 100 bpm",
        "Heart Rate: 90 bpm",
        "Creatinine (Blood): 1.25 mg/dL",
    ]


@pytest.mark.parametrize("budget", [None, 64, 512])
def test_the_input_order_of_same_time_events_never_shows(dataset, encoder, budget):
    """The text is a function of the events, not of their order within an instant (a MEDS
    ETL's, or none: FHIR resources of different types)."""
    shuffle = random.Random(7).shuffle
    for subject in dataset:
        rows = list(
            zip(
                subject.times,
                subject.codes,
                subject.numeric_values,
                subject.text_values,
                strict=True,
            )
        )
        groups: dict[object, list[tuple]] = {}
        for row in rows:
            groups.setdefault(row[0], []).append(row)
        for group in groups.values():
            shuffle(group)
        shuffled = [
            (None if np.isnat(t) else t.astype(datetime), c, None if np.isnan(v) else v, x)
            for group in groups.values()
            for t, c, v, x in group
        ]
        reference = render_record(subject, dataset.descriptions, PREDICTION_TIME, encoder, budget)
        other = render_record(
            events_of(*shuffled), dataset.descriptions, PREDICTION_TIME, encoder, budget
        )
        assert other == reference


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("LAB//220045//bpm", ("Heart Rate", "bpm")),  # description, unit moved after the value
        ("DIAGNOSIS//ICD//9//4019", ("Diagnosis: Unspecified essential hypertension", None)),
        ("LAB//999999//mmHg", ("Lab 999999", "mmHg")),  # fallback from the code itself
        ("LAB//51087//UNK", ("Lab 51087", None)),
        ("DIAGNOSIS//ICD//10//I10", ("Diagnosis: ICD / 10 / I10", None)),
        (
            "HOSPITAL_ADMISSION//URGENT//TRANSFER FROM HOSPITAL",
            ("Hospital admission: urgent / transfer from hospital", None),
        ),
        (
            "ICU_ADMISSION//Medical Intensive Care Unit (MICU)",
            ("ICU admission: Medical Intensive Care Unit (MICU)", None),
        ),
        ("GENDER//M", ("Gender: M", None)),
        ("MEDS_BIRTH", ("Birth", None)),
        ("MEDS_DEATH", ("Death", None)),
        ("Blood Pressure", ("Blood Pressure", None)),
    ],
)
def test_describe_code(code, expected):
    assert describe_code(code, DESCRIPTIONS) == expected


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (80.0, "80"),
        (15.100000381469727, "15.1"),
        (-1.0, "-1"),
        (0.000123, "0.000123"),
        (2.5e7, "25000000"),
    ],
)
def test_format_value(value, text):
    assert format_value(value) == text


def test_text_values_and_age(dataset):
    record = render_record(dataset.events(1), dataset.descriptions, PREDICTION_TIME)
    lines = record.text.splitlines()
    assert lines[0] == "Age: 60 years"
    assert "Lab 51003: <0.01" in lines
    assert "Medication: START Heparin" in lines


def test_no_leakage_events_at_or_after_prediction_time_never_appear():
    cut = datetime(2150, 1, 1, 12)
    events = events_of(
        (cut - timedelta(minutes=1), "BEFORE", None, None),
        (cut, "AT_PREDICTION_TIME", None, None),
        (cut + timedelta(hours=1), "AFTER", None, None),
        (None, "STATIC", None, None),
    )
    record = render_record(events, {}, cut)  # MEDS: up to and including the prediction time
    assert "Before" in record.text and "Static" in record.text
    assert "At prediction time" in record.text and "After" not in record.text
    assert record.n_events_total == 3
    strict = render_record(events, {}, cut, inclusive=False)
    assert "Before" in strict.text and "At prediction time" not in strict.text
    assert strict.n_events_total == 2


def test_no_leakage_on_dataset_records(dataset):
    for subject in dataset:
        text = render_record(subject, dataset.descriptions, PREDICTION_TIME).text
        assert "2150-03-02 08:30" not in text  # first vitals at/after the prediction time
        assert "Heart Rate: 94 bpm" not in text  # hour 24's value
        assert "Heart Rate: 93 bpm" in text  # hour 23's value is before


def test_deterministic(dataset, encoder):
    a = render_record(dataset.events(2), dataset.descriptions, PREDICTION_TIME, encoder, 300)
    b = render_record(dataset.events(2), dataset.descriptions, PREDICTION_TIME, encoder, 300)
    assert a == b


@pytest.mark.parametrize("budget", [80, 150, 300, 500])
def test_budget_keeps_newest_and_counts_original_tokens(dataset, encoder, budget):
    full = render_record(dataset.events(3), dataset.descriptions, PREDICTION_TIME, encoder)
    assert full.n_tokens > 500
    record = render_record(
        dataset.events(3), dataset.descriptions, PREDICTION_TIME, encoder, budget
    )
    assert record.n_tokens == len(encoder.encode(record.text)) <= budget
    assert record.n_tokens > budget - 40  # the budget is used, not wasted
    assert 0 < record.n_events_kept < record.n_events_total
    lines = record.text.splitlines()
    assert lines[0] == "Age: 60 years"
    assert lines[1] == f"({record.n_events_total - record.n_events_kept:,} earlier events omitted)"
    assert lines[2:4] == ["[static]", "Gender: F"]
    assert lines[4].startswith("[2150-03-0")  # first group shown carries its date
    assert full.text.endswith(record.text.split("\n", 4)[4].split("\n", 1)[1])  # newest suffix kept


def test_larger_budget_keeps_more(dataset, encoder):
    kept = [
        render_record(
            dataset.events(1), dataset.descriptions, PREDICTION_TIME, encoder, b
        ).n_events_kept
        for b in (80, 160, 320, 640)
    ]
    assert kept == sorted(kept) and kept[0] < kept[-1]


def test_record_within_budget_is_whole(dataset, encoder):
    full = render_record(dataset.events(1), dataset.descriptions, PREDICTION_TIME, encoder)
    fitted = render_record(
        dataset.events(1), dataset.descriptions, PREDICTION_TIME, encoder, full.n_tokens + 50
    )
    assert fitted.text == full.text and fitted.n_events_kept == fitted.n_events_total


def test_budget_too_small(dataset, encoder):
    with pytest.raises(BudgetTooSmallError):
        render_record(dataset.events(1), dataset.descriptions, PREDICTION_TIME, encoder, 3)


def test_budget_needs_encoder(dataset):
    with pytest.raises(ValueError, match="tokenizer"):
        render_record(dataset.events(1), dataset.descriptions, PREDICTION_TIME, None, 100)


def test_huge_record_fits_budget(encoder):
    specs = [
        (T0 + timedelta(minutes=i), "LAB//220045//bpm", float(60 + i % 50), None)
        for i in range(20_000)
    ]
    record = render_record(events_of(*specs), DESCRIPTIONS, None, encoder, 500)
    assert record.n_tokens <= 500 and record.n_events_total == 20_000
    assert record.text.endswith(f"Heart Rate: {60 + 19_999 % 50} bpm")
