"""The research figures on paired readings (`tools.research.fidelity_figures`) on constructed cases:
a kept ranking told from noise, a shared logit shift told from a spread, and a served dtype's
error split into the rows' own and two roundings."""

from __future__ import annotations

import numpy as np
import pytest

from medtpe.core.metrics.fidelity import fidelity
from tests.core.tasks.test_answer_contract import pair
from tools.research.fidelity_figures import (
    logit_agreement,
    logit_shift,
    paired_r_difference,
    rounding_parts,
)


def test_logit_agreement_tells_a_kept_ranking_from_noise_about_a_constant():
    """An original whose p barely varies: MedTPE readings as far from it as its own spread
    either follow it (a kept ranking: r near 1) or not (noise: r near 0, and a mean |Δp| no
    better than the constant that reads no record)."""
    rng = np.random.default_rng(5)
    logit = 1.8 + rng.normal(0, 0.15, 60)
    sides = {
        "kept": logit * 1.5 - 0.9,  # the same ranking, stretched
        "noise": 1.8 + rng.normal(0, 0.2, 60),
    }
    original = 1 / (1 + np.exp(-logit))
    pairs = {
        name: [
            pair(k // 3, True, True, o, m)
            for k, (o, m) in enumerate(zip(original, 1 / (1 + np.exp(-side)), strict=True))
        ]
        for name, side in sides.items()
    }
    kept, noise = (logit_agreement(pairs[n], "yes", n_resamples=200) for n in ("kept", "noise"))
    assert kept["n"] == noise["n"] == 60
    assert kept["r"]["value"] == pytest.approx(1.0) and kept["r"]["low"] > 0.99
    assert noise["r"]["low"] < 0 < noise["r"]["high"] < 0.6
    assert kept["sd_medtpe"] == pytest.approx(1.5 * kept["sd_original"])
    assert kept["constant_delta_p_mean"] == noise["constant_delta_p_mean"]
    noise_delta = fidelity(pairs["noise"], n_resamples=20)["delta_p_mean"]["value"]
    assert noise_delta > noise["constant_delta_p_mean"]
    difference = paired_r_difference(pairs["noise"], pairs["kept"], n_resamples=200)
    assert difference["n"] == 60 and 0.5 < difference["low"] < difference["value"] < 1.0
    with pytest.raises(ValueError, match="same records"):
        paired_r_difference(pairs["kept"], pairs["kept"][1:])
    assert logit_agreement(pairs["kept"][:3], "yes") == {"n": 3}  # one patient: no interval


def test_logit_shift_tells_a_shared_shift_from_noise():
    rng = np.random.default_rng(3)
    original = rng.uniform(0.3, 0.95, 40)
    logit = np.log(original / (1 - original))
    shifted = 1 / (1 + np.exp(-(logit - 0.5 + rng.normal(0, 0.05, 40))))  # one shared shift
    noisy = 1 / (1 + np.exp(-(logit + rng.choice([-0.5, 0.5], 40))))  # as large, no direction
    both = [
        [
            pair(k // 2, True, True, o, m)
            for k, (o, m) in enumerate(zip(original, side, strict=True))
        ]
        for side in (shifted, noisy)
    ]
    shift, noise = (logit_shift(pairs, "yes", n_resamples=200) for pairs in both)
    assert shift["n"] == noise["n"] == 40 and shift["n_lower"] == 40
    assert 0.45 < shift["shift_mean"]["low"] < shift["shift_mean"]["value"] < 0.55
    assert shift["shift_sd"] < 0.1 and shift["residual_mean"] < 0.01 < shift["signed_mean"] * -1
    assert noise["shift_mean"]["low"] < 0 < noise["shift_mean"]["high"]
    assert noise["shift_sd"] > 0.4 and noise["residual_mean"] > 0.05
    # both are 0.5 in the logit, whatever its sign; p(1 - p) is the originals' own
    assert noise["abs_shift_mean"]["value"] == pytest.approx(0.5)
    assert 0.45 < shift["abs_shift_mean"]["value"] < 0.55
    assert shift["sensitivity_mean"] == pytest.approx(float((original * (1 - original)).mean()))
    assert logit_shift([pair(1, None, None)], "yes") == {"n": 0}


def test_rounding_parts_split_the_served_error_into_the_rows_and_two_roundings():
    """Two prompts of different tokens rounded independently and alike: perfect rows stay near
    sqrt(2) times the floor; the same rounding on both sides cancels; the rows' own error adds."""
    rng = np.random.default_rng(11)
    n = 400
    sigmoid = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    original = 1.8 + rng.normal(0, 0.15, n)
    rows_error = rng.normal(0, 0.1, n)
    rounding = {"original": rng.normal(0, 0.1, n), "medtpe": rng.normal(0, 0.1, n)}

    def reading(rows: np.ndarray, medtpe_rounding: np.ndarray) -> tuple[list, list]:
        exact = [
            pair(k // 4, True, True, sigmoid(o), sigmoid(o + e))
            for k, (o, e) in enumerate(zip(original, rows, strict=True))
        ]
        served = [
            pair(k // 4, True, True, sigmoid(o + a), sigmoid(o + e + b))
            for k, (o, e, a, b) in enumerate(
                zip(original, rows, rounding["original"], medtpe_rounding, strict=True)
            )
        ]
        return exact, served

    independent = rounding_parts(*reading(np.zeros(n), rounding["medtpe"]), n_resamples=200)
    assert independent["n"] == n and independent["sd"]["rows"] == pytest.approx(0, abs=1e-9)
    assert independent["rounding_r"]["low"] < 0 < independent["rounding_r"]["high"]
    assert 1.25 < independent["to_floor"]["perfect_rows"] < 1.6
    assert independent["served"]["value"] == pytest.approx(independent["perfect_rows"]["value"])
    shared = rounding_parts(*reading(np.zeros(n), rounding["original"]), n_resamples=200)
    assert shared["rounding_r"]["value"] == pytest.approx(1.0)
    assert shared["perfect_rows"]["value"] < 1e-9 and shared["to_floor"]["served"] < 1e-6
    with_rows = rounding_parts(*reading(rows_error, rounding["medtpe"]), n_resamples=200)
    assert with_rows["sd"]["rows"] == pytest.approx(rows_error.std())
    assert with_rows["independent_sd"] == pytest.approx(with_rows["sd"]["served"], rel=0.1)
    assert with_rows["to_floor"]["served"] > with_rows["to_floor"]["perfect_rows"] + 0.2
    # perfect rows read only the roundings: the rows' own error leaves them as they were
    assert with_rows["perfect_rows"]["value"] == pytest.approx(independent["perfect_rows"]["value"])
    assert rounding_parts([pair(1, None, None)], [pair(1, None, None)]) == {"n": 0}
    with pytest.raises(ValueError, match="same records"):
        rounding_parts(*reading(np.zeros(n), rounding["medtpe"])[:1], [])
