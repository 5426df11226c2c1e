"""The labelled prediction point (`medtpe.core.meds.prediction_point`): one type for a label file's
row, an evaluation record's identity and a build window, read and written as JSON lines."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from medtpe.core.meds import read_labels
from medtpe.core.meds.labels import write_labels
from medtpe.core.meds.prediction_point import (
    PredictionPoint,
    read_points,
    record_key,
    subject_of,
    write_points,
)
from medtpe.core.tasks import get_task

WHEN = datetime(2150, 3, 2, 8, 30)


def test_json_round_trip_and_key() -> None:
    point = PredictionPoint(7, WHEN, True, task="icu_mortality", budget=4096)
    assert PredictionPoint.from_json(json.loads(json.dumps(point.to_json()))) == point
    assert point.key == record_key(7, WHEN.isoformat()) == "7@2150-03-02T08:30:00"
    assert subject_of(point.key) == 7


def test_build_windows_written_before_the_type_still_read() -> None:
    legacy = {"subject_id": 3, "time": WHEN.isoformat(), "task": "phenotyping", "budget": None}
    assert PredictionPoint.from_json(legacy) == PredictionPoint(3, WHEN, task="phenotyping")


def test_parsed_label_follows_the_task() -> None:
    phenotyping = get_task("phenotyping")
    first, second = phenotyping.labels[:2]
    raw = PredictionPoint(1, WHEN, f"{first}|{second}")
    assert raw.parsed(phenotyping).label == [first, second]
    assert PredictionPoint(1, WHEN).parsed(phenotyping).label is None


def test_jsonl_lines_carry_the_point_then_their_fields(tmp_path: Path) -> None:
    points = [PredictionPoint(1, WHEN, False), PredictionPoint(2, WHEN, True, budget=512)]
    path = tmp_path / "rendered.jsonl"
    write_points(path, points, [{"prompt": "a"}, {"prompt": "b"}])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert list(lines[0]) == ["subject_id", "prediction_time", "label", "task", "budget", "prompt"]
    assert read_points(path) == points


def test_label_file_rows_are_points(tmp_path: Path) -> None:
    task = get_task("icu_mortality")
    points = [PredictionPoint(1, WHEN, True), PredictionPoint(2, WHEN, False)]
    write_labels(points, task, tmp_path / "labels.parquet")
    assert read_labels(tmp_path / "labels.parquet") == points
