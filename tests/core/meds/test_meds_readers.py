"""MEDS dataset and label readers on a synthetic dataset built here with pyarrow."""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from medtpe.core.meds.readers import MedsDataset, MedsFormatError, read_labels
from tests.support.meds_fixtures import (
    DESCRIPTIONS,
    PREDICTION_TIME,
    subject_rows,
    write_meds_dataset,
    write_table,
)


@pytest.fixture
def dataset_dir(tmp_path):
    return write_meds_dataset(tmp_path / "meds")


def test_dataset_reads_shards_sorted_and_grouped(dataset_dir):
    dataset = MedsDataset.load(dataset_dir)
    assert dataset.subject_ids == [1, 2, 3]
    assert dataset.n_events == 3 * len(subject_rows(1))
    assert dataset.descriptions == DESCRIPTIONS
    assert dataset.metadata == {"dataset_name": "synthetic"}
    events = dataset.events(2)
    assert events.subject_id == 2 and len(events) == len(subject_rows(2))
    assert np.isnat(events.times[0]) and events.codes[0] == "GENDER//F"
    times = events.times[1:].astype("int64")
    assert (np.diff(times) >= 0).all()
    # same-time events keep file order: the fixture reversed them, so the reversed order shows
    first_vitals = [
        c
        for t, c in zip(events.times, events.codes, strict=True)
        if t == np.datetime64("2150-03-01T08:30")
    ]
    assert first_vitals == [
        "LAB//51003//ng/mL",
        "LAB//50912//mg/dL",
        "LAB//220210//insp/min",
        "LAB//220045//bpm",
    ]
    heart = events.numeric_values[list(events.codes).index("LAB//220045//bpm")]
    assert heart == pytest.approx(70.0)
    assert events.text_values[list(events.codes).index("LAB//51003//ng/mL")] == "<0.01"
    assert [s.subject_id for s in dataset] == [1, 2, 3]


def test_dataset_without_optional_metadata(tmp_path):
    write_table(tmp_path / "data" / "0.parquet", subject_rows(5, hours=2))
    dataset = MedsDataset.load(tmp_path)
    assert dataset.descriptions == {} and dataset.metadata == {}
    assert dataset.subject_ids == [5]


def test_not_a_meds_dir(tmp_path):
    with pytest.raises(MedsFormatError, match="data/"):
        MedsDataset.load(tmp_path)


def test_missing_required_column_is_named(tmp_path):
    pq.write_table(pa.table({"subject_id": [1], "code": ["A"]}), tmp_path / "x.parquet")
    (tmp_path / "data").mkdir()
    (tmp_path / "x.parquet").rename(tmp_path / "data" / "x.parquet")
    with pytest.raises(MedsFormatError, match="time"):
        MedsDataset.load(tmp_path)


def test_wrongly_typed_column_is_named(tmp_path):
    table = pa.table(
        {"subject_id": ["one"], "time": pa.array([None], pa.timestamp("us")), "code": ["A"]}
    )
    (tmp_path / "data").mkdir()
    pq.write_table(table, tmp_path / "data" / "x.parquet")
    with pytest.raises(MedsFormatError, match="subject_id"):
        MedsDataset.load(tmp_path)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_numeric_value_is_an_error(tmp_path, bad):
    rows = subject_rows(1, hours=2)
    rows[-1]["numeric_value"] = bad
    write_table(tmp_path / "data" / "0.parquet", rows)
    with pytest.raises(MedsFormatError, match="numeric_value"):
        MedsDataset.load(tmp_path)


def test_null_code_is_an_error(tmp_path):
    rows = subject_rows(1, hours=2)
    rows[3]["code"] = None
    write_table(tmp_path / "data" / "0.parquet", rows)
    with pytest.raises(MedsFormatError, match="code"):
        MedsDataset.load(tmp_path)


def test_unreadable_parquet(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "0.parquet").write_text("not parquet")
    with pytest.raises(MedsFormatError, match=r"0\.parquet"):
        MedsDataset.load(tmp_path)


def test_labels(dataset_dir):
    rows = read_labels(dataset_dir / "labels" / "icu_mortality.parquet")
    assert [(r.subject_id, r.prediction_time, r.label) for r in rows] == [
        (1, PREDICTION_TIME, False),
        (2, PREDICTION_TIME, True),
        (3, PREDICTION_TIME, False),
    ]
    assert len(read_labels(dataset_dir / "labels")) == 3  # a directory of label files


def test_labels_categorical(tmp_path):
    table = pa.table(
        {
            "subject_id": pa.array([1, 2], pa.int64()),
            "prediction_time": pa.array(
                [datetime(2150, 1, 1), datetime(2150, 1, 2)], pa.timestamp("us")
            ),
            "categorical_value": pa.array(["A|D", ""], pa.string()),
        }
    )
    pq.write_table(table, tmp_path / "l.parquet")
    assert [r.label for r in read_labels(tmp_path / "l.parquet")] == ["A|D", ""]


def test_labels_without_value_column_are_unlabelled(tmp_path):
    table = pa.table(
        {
            "subject_id": pa.array([1], pa.int64()),
            "prediction_time": pa.array([datetime(2150, 1, 1)], pa.timestamp("us")),
        }
    )
    pq.write_table(table, tmp_path / "l.parquet")
    assert read_labels(tmp_path / "l.parquet")[0].label is None


def test_labels_null_value_is_an_error(tmp_path):
    table = pa.table(
        {
            "subject_id": pa.array([1], pa.int64()),
            "prediction_time": pa.array([datetime(2150, 1, 1)], pa.timestamp("us")),
            "boolean_value": pa.array([None], pa.bool_()),
        }
    )
    pq.write_table(table, tmp_path / "l.parquet")
    with pytest.raises(MedsFormatError, match="boolean_value"):
        read_labels(tmp_path / "l.parquet")


def test_labels_missing_prediction_time(tmp_path):
    pq.write_table(
        pa.table({"subject_id": pa.array([1], pa.int64()), "boolean_value": [True]}),
        tmp_path / "l.parquet",
    )
    with pytest.raises(MedsFormatError, match="prediction_time"):
        read_labels(tmp_path / "l.parquet")


def test_labels_null_prediction_time(tmp_path):
    table = pa.table(
        {
            "subject_id": pa.array([1], pa.int64()),
            "prediction_time": pa.array([None], pa.timestamp("us")),
        }
    )
    pq.write_table(table, tmp_path / "l.parquet")
    with pytest.raises(MedsFormatError, match="prediction_time"):
        read_labels(tmp_path / "l.parquet")


def test_labels_non_finite_float(tmp_path):
    table = pa.table(
        {
            "subject_id": pa.array([1], pa.int64()),
            "prediction_time": pa.array([datetime(2150, 1, 1)], pa.timestamp("us")),
            "float_value": pa.array([math.nan], pa.float32()),
        }
    )
    pq.write_table(table, tmp_path / "l.parquet")
    with pytest.raises(MedsFormatError, match="float_value"):
        read_labels(tmp_path / "l.parquet")


def test_missing_label_file(tmp_path):
    with pytest.raises(MedsFormatError, match="no parquet"):
        read_labels(tmp_path / "nope.parquet")
