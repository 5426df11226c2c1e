"""The predictions file's format (`medtpe.core.meds.predictions_file`) on plain scored records:
labels and answers as targets, the binary and multi-label layouts, checked by the real
meds-evaluation package's schema and scores."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl
import pytest
from meds_evaluation.evaluate import evaluate_binary_classification
from meds_evaluation.schema import PredictionSchema

from medtpe.core.meds.predictions_file import UNSCORED_PROBABILITY, as_target, results_table
from medtpe.core.tasks import get_task

WHEN = datetime(2150, 3, 2, 8)
MORTALITY = get_task("icu_mortality")
PHENOTYPING = get_task("phenotyping")


@dataclass(frozen=True)
class Scored:
    """A record's result as the format reads it (`ScoredRecord`)."""

    label: Any
    prediction: Any
    format_ok: bool = True
    p_yes: float | None = None


def test_targets_for_binary_and_multilabel() -> None:
    assert as_target(MORTALITY, None) is False
    assert as_target(MORTALITY, True) is True
    first, third = PHENOTYPING.labels[0], PHENOTYPING.labels[2]
    vector = as_target(PHENOTYPING, [first, third])
    assert vector[0] and vector[2] and sum(vector) == 2
    assert as_target(PHENOTYPING, None) == [False] * len(PHENOTYPING.labels)


def test_binary_rows_write_unparsed_answers_wrong_and_missing_probabilities_unscored() -> None:
    rows = [
        Scored(True, True, p_yes=0.9),
        Scored(True, None, format_ok=False),  # unparsed: the wrong value, no probability
        Scored(False, False, p_yes=0.2),
    ]
    table = results_table(MORTALITY, [1, 2, 3], [WHEN] * 3, rows)
    PredictionSchema.align(table)  # the package's own schema check
    assert table.to_pydict() == {
        "subject_id": [1, 2, 3],
        "prediction_time": [WHEN] * 3,
        "boolean_value": [True, True, False],
        "predicted_boolean_value": [True, False, False],
        "predicted_boolean_probability": [0.9, UNSCORED_PROBABILITY, 0.2],
    }


def test_multilabel_rows_are_one_per_label_in_label_order() -> None:
    first, second = PHENOTYPING.labels[:2]
    rows = [Scored([first], [first]), Scored([first, second], None, format_ok=False)]
    table = results_table(PHENOTYPING, [1, 2], [WHEN, WHEN], rows)
    n = len(PHENOTYPING.labels)
    assert table.num_rows == 2 * n
    PredictionSchema.align(table)
    assert table.column("subject_id").to_pylist() == [1] * n + [2] * n
    truth = table.column("boolean_value").to_pylist()
    assert truth[:n] == [label == first for label in PHENOTYPING.labels]
    predicted = table.column("predicted_boolean_value").to_pylist()
    assert truth[:n] == predicted[:n]  # record 1 exactly right
    assert predicted[n:] == [not v for v in truth[n:]]  # record 2 unparsed: wrong everywhere
    assert table.column("predicted_boolean_probability").null_count == 2 * n
    scored = evaluate_binary_classification(pl.from_arrow(table))["samples_equally_weighted"]
    assert scored["binary_accuracy"] == pytest.approx(0.5)
    assert "roc_auc_score" not in scored  # no probabilities for a list answer
