"""A labelled prediction point: one subject, the time of the prediction, its label, and (when a
build assigns them) the task whose prompt it gets and that prompt's input budget.

It is the row of a MEDS label file (`medtpe.core.meds.readers.read_labels`), the record of an
evaluation (with its subject's events, `medtpe.evaluation.records.EvalRecord`), a window of
`medtpe build-artefact`, and the identity fields of every JSON line the project writes about
one prediction (`medtpe render`, the build's windows and rendered prompts).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from medtpe.core.tasks import Task

LabelValue = bool | int | float | str | list[str] | None
"""A label file's value (bool, int, float, str) or a task's parsed label (`Task.parse_label`:
bool, a label name, label names); None when the point has no label."""

LEGACY_TIME_KEY = "time"
"""The key the build's window files used for the prediction time before this type existed."""


@dataclass(frozen=True)
class PredictionPoint:
    """One prediction: `subject_id` at `prediction_time`, its `label` (None: unlabelled), the
    `task` whose prompt it gets and the prompt's input `budget` (None: the caller's default)."""

    subject_id: int
    prediction_time: datetime
    label: LabelValue = None
    task: str | None = None
    budget: int | None = None

    @property
    def key(self) -> str:
        """Identity across modes and files: `<subject_id>@<prediction time, ISO 8601>`."""
        return record_key(self.subject_id, self.prediction_time.isoformat())

    def parsed(self, task: Task) -> PredictionPoint:
        """The point with its label as `task` reads it (None stays None)."""
        label = None if self.label is None else task.parse_label(self.label)
        return replace(self, label=label)

    def to_json(self) -> dict[str, Any]:
        """The point as a JSON object (the prediction time in ISO 8601)."""
        return {
            "subject_id": self.subject_id,
            "prediction_time": self.prediction_time.isoformat(),
            "label": self.label,
            "task": self.task,
            "budget": self.budget,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PredictionPoint:
        """Inverse of `to_json`; other keys of the line are ignored, and the build's older
        window files (`time` for the prediction time) still read."""
        when = data["prediction_time"] if "prediction_time" in data else data[LEGACY_TIME_KEY]
        return cls(
            subject_id=int(data["subject_id"]),
            prediction_time=datetime.fromisoformat(when),
            label=data.get("label"),
            task=data.get("task"),
            budget=data.get("budget"),
        )


def record_key(subject_id: int, prediction_time: object) -> str:
    """Identity of a labelled record across modes: subject and prediction time."""
    return f"{subject_id}@{prediction_time}"


def subject_of(key: str) -> int:
    """The subject id of a record key (`record_key`'s inverse for the subject)."""
    return int(key.partition("@")[0])


def read_points(path: str | Path) -> list[PredictionPoint]:
    """The points of a JSON-lines file whose lines carry a point's fields (blank lines skipped)."""
    with Path(path).open(encoding="utf-8") as handle:
        return [PredictionPoint.from_json(json.loads(line)) for line in handle if line.strip()]


def write_points(
    path: str | Path, points: Iterable[PredictionPoint], extras: Iterable[Mapping[str, Any]]
) -> None:
    """A JSON-lines file: each point's fields, then its line's `extras` (prompt, text, ...)."""
    with Path(path).open("w", encoding="utf-8") as handle:
        for point, extra in zip(points, extras, strict=True):
            handle.write(json.dumps(point.to_json() | dict(extra), ensure_ascii=False) + "\n")
