"""The compression-curve study's rule, fit and internal split
(`tools.research.compression_curve`)."""

from __future__ import annotations

import math

import pytest

from tools.research.compression_curve import internal_split, log_linear, recommend


def cell(method: str, max_n: int, budget: int, rate: float, speed: float) -> dict:
    return {"method": method, "max_n": max_n, "budget": budget, "rate": rate, "speed_ratio": speed}


def test_rule_takes_the_best_fast_setting_and_its_smallest_budget_near_its_plateau() -> None:
    cells = [
        cell("static", 2, 1000, 0.43, 0.95),
        cell("bpe", 4, 1000, 0.49, 0.95),
        cell("bpe", 4, 5000, 0.541, 0.95),
        cell("bpe", 4, 8000, 0.545, 0.95),
        cell("bpe", 8, 8000, 0.60, 0.5),  # best rate, too slow
    ]
    choice = recommend(cells, tolerance=0.005, min_speed=0.9)
    assert choice is not None
    assert (choice["method"], choice["max_n"], choice["budget"]) == ("bpe", 4, 5000)
    assert choice["speed_floor"] == 0.9


def test_rule_prefers_the_smaller_n_within_tolerance() -> None:
    cells = [cell("bpe", 6, 5000, 0.570, 1.0), cell("bpe", 8, 5000, 0.573, 1.0)]
    choice = recommend(cells, tolerance=0.005, min_speed=0.9)
    assert choice is not None and choice["max_n"] == 6


def test_a_slow_reference_lowers_the_speed_floor_to_near_it() -> None:
    cells = [cell("static", 2, 1000, 0.43, 0.84), cell("bpe", 6, 5000, 0.57, 0.81)]
    choice = recommend(cells, tolerance=0.005, min_speed=0.9)
    assert choice is not None
    assert choice["speed_floor"] == pytest.approx(0.798)
    assert choice["max_n"] == 6


def test_log_linear_recovers_a_log_trend() -> None:
    xs = [1e5, 2e5, 4e5, 8e5]
    fit = log_linear(xs, [0.1 + 0.02 * math.log(x) for x in xs])
    assert fit["slope"] == pytest.approx(0.02, abs=1e-5)
    assert fit["per_doubling"] == pytest.approx(0.02 * math.log(2), abs=1e-5)


def test_every_fifth_training_subject_validates() -> None:
    mining, validation = internal_split(list(range(10, 22)), 5)
    assert validation == [10, 15, 20]
    assert mining == [11, 12, 13, 14, 16, 17, 18, 19, 21]
