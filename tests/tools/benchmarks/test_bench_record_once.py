"""The record-once benchmark's figures: answers compared pair by pair, latencies and ratios;
its windows taken across patients."""

from __future__ import annotations

from typing import Any

import pytest

from tools.benchmarks.bench_record_once import (
    across_subjects,
    compare,
    latency,
    max_abs_dp,
    ratio,
    spread,
)


def row(prediction: Any, probabilities: dict[str, float] | None) -> dict[str, Any]:
    return {"prediction": prediction, "probabilities": probabilities}


def test_max_abs_dp_over_the_options_both_give() -> None:
    assert max_abs_dp({"yes": 0.7, "no": 0.3}, {"yes": 0.65, "no": 0.2}) == pytest.approx(0.1)
    assert max_abs_dp({"yes": 0.7}, {"no": 0.3}) is None
    assert max_abs_dp(None, {"yes": 0.7}) is None


def test_compare_counts_equal_answers_and_the_largest_gap() -> None:
    reference = [row("yes", {"yes": 0.8, "no": 0.2}), row(["sepsis"], None), row("no", None)]
    other = [row("yes", {"yes": 0.75, "no": 0.25}), row(["sepsis"], None), row("yes", None)]
    figures = compare(reference, other)
    assert figures == {"compared": 3, "equal_answers": 2, "max_abs_dp": 0.05}


def test_compare_keeps_an_exact_match_as_a_zero_gap() -> None:
    same = [row("no", {"yes": 0.1, "no": 0.9})]
    assert compare(same, same)["max_abs_dp"] == 0.0
    assert compare([row("no", None)], [row("no", None)])["max_abs_dp"] is None


def test_latency_and_ratio_of_medians() -> None:
    one = latency([1.0, 2.0, 3.0])
    four = latency([2.0])
    assert one == {"p50_s": 2.0, "p95_s": 2.9}
    assert four == {"p50_s": 2.0, "p95_s": 2.0}
    assert ratio(four, one) == 1.0
    assert spread([0.2, 0.1, 0.15]) == {"p50": 0.15, "min": 0.1, "max": 0.2}


def test_windows_are_taken_across_subjects_before_a_subjects_second() -> None:
    points = [(7, 1), (7, 2), (7, 3), (3, 1), (9, 1), (9, 2)]
    assert across_subjects(points) == [(7, 1), (3, 1), (9, 1), (7, 2), (9, 2), (7, 3)]
    assert across_subjects([]) == []
