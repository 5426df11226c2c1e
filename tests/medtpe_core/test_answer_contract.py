"""The answer contract over generated model outputs (property tests), the stop rule's ids under
both tokenizers, and the paired fidelity figures on hand-computed cases."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from medtpe_core.fidelity import (
    PairedAnswer,
    Thresholds,
    fidelity,
    logit_agreement,
    logit_shift,
    paired_r_difference,
    rounding_parts,
)
from medtpe_core.tasks import get_task
from medtpe_core.tasks.answers import (
    ANSWER_END,
    MISSING,
    AnswerReading,
    answer_end_ids,
    read_answer,
)

MORTALITY = get_task("icu_mortality")
PHENOTYPING = get_task("phenotyping")
VALUES = st.sampled_from(["yes", "no"])
WHITESPACE = st.text(alphabet=" \n\t", max_size=3)
# what a model may write after its answer: anything, an echo of the other option included
AFTER = st.one_of(
    st.text(max_size=40),
    st.sampled_from([' or {"answer": "no"}', ' or {"answer": "yes"}', "\n\nThe patient died."]),
)


@given(VALUES, WHITESPACE, WHITESPACE, AFTER)
@example("yes", "", "", ' or {"answer": "no"}')
def test_the_first_answer_object_is_the_answer(value, before, spacing, after):
    output = before + json.dumps({"answer": value}) + spacing + after
    parsed = MORTALITY.parse_answer(output)
    assert parsed.prediction is (value == "yes")
    rest = spacing + after
    assert parsed.format_ok is (not rest.strip())
    assert parsed.trailing == (rest if rest.strip() else "")


@given(st.text(min_size=1, max_size=40).filter(lambda t: t.strip()), VALUES)
@example("Sure! ", "no")
def test_strict_reading_refuses_text_before_the_object(prose, value):
    output = prose + json.dumps({"answer": value})
    parsed = MORTALITY.parse_answer(output)
    if not prose.strip().startswith("{"):
        assert parsed == (None, False, "") or parsed.prediction is None
    lenient = MORTALITY.model_copy(update={"answer_reading": AnswerReading.LENIENT})
    if "{" not in prose and "}" not in prose:
        assert lenient.parse_answer(output)[:2] == (value == "yes", True)


@given(st.lists(st.sampled_from(PHENOTYPING.letters), max_size=5), WHITESPACE, AFTER)
def test_multilabel_answers_follow_the_same_contract(letters, spacing, after):
    output = json.dumps({"answer": letters}) + spacing + after
    parsed = PHENOTYPING.parse_answer(output)
    chosen = {PHENOTYPING.labels[PHENOTYPING.letters.index(x)] for x in letters}
    assert parsed.prediction == [label for label in PHENOTYPING.labels if label in chosen]
    assert parsed.format_ok is (not (spacing + after).strip())


@given(st.text(max_size=60))
def test_any_text_reads_without_error(text):
    for reading in AnswerReading:
        found = read_answer(text, reading)
        assert found.value is MISSING or found.trailing in text
        assert not found.compliant or found.value is not MISSING


def test_stop_ids_are_the_tokens_that_close_an_object():
    texts = ['"}', "yes", "}\n\nThe", "{", ' "{}']
    stop = answer_end_ids(lambda ids: [texts[i] for i in ids], len(texts))
    assert stop == {0, 2, 4}
    assert all(ANSWER_END in texts[i] for i in stop)


def probs(p: float | None) -> dict[str, float] | None:
    return None if p is None else {"yes": p, "no": 1 - p}


def pair(subject, original, medtpe, p_o=None, p_m=None, **kw) -> PairedAnswer:
    return PairedAnswer(subject, original, medtpe, probs(p_o), probs(p_m), **kw)


def test_fidelity_figures_by_hand():
    pairs = [
        pair(1, True, True, 0.8, 0.7, text_original='{"answer": "yes"}', finish_original="stop"),
        pair(2, False, True, 0.4, 0.6, generated_original=3, generated_medtpe=4),
        pair(3, True, True, 0.9, 0.9, trailing_medtpe=True, format_ok_medtpe=False),
        pair(4, None, None),  # no probabilities: out of the |Δp| figures
    ]
    report = fidelity(pairs, n_resamples=200)
    # record 4 (answered by neither) says nothing of agreement
    assert report["same_answer"]["value"] == pytest.approx(2 / 3) and report["n_answered"] == 3
    assert report["delta_p_n"] == 3
    assert report["delta_p_mean"]["value"] == pytest.approx((0.1 + 0.2 + 0.0) / 3)
    low, high = report["delta_p_mean"]["low"], report["delta_p_mean"]["high"]
    assert 0.0 <= low <= report["delta_p_mean"]["value"] <= high <= 0.2
    kl = 0.8 * math.log(0.8 / 0.7) + 0.2 * math.log(0.2 / 0.3)
    kl2 = 0.4 * math.log(0.4 / 0.6) + 0.6 * math.log(0.6 / 0.4)
    assert report["kl_mean"]["value"] == pytest.approx((kl + kl2) / 3, abs=1e-5)
    assert report["same_stop"] == pytest.approx(3 / 4)  # record 1's texts differ
    assert report["generated_tokens_mean"] == {"original": 0.75, "medtpe": 1.0}
    assert report["fcr_strict"]["medtpe"] == 0.75 and report["trailing_text"]["medtpe"] == 1
    assert report["answer_counts"]["original"] == {"false": 1, "null": 1, "true": 2}


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


def test_gate_thresholds():
    agreeing = [pair(k, True, True, 0.8, 0.79) for k in range(20)]
    assert Thresholds().check(fidelity(agreeing, n_resamples=20)) == []
    drifting = [pair(k, True, True, 0.8, 0.6) for k in range(20)]
    assert Thresholds().check(fidelity(drifting, n_resamples=20)) == ["mean |Δp| 0.2000 > 0.03"]
    split = [pair(k, True, k % 2 == 0, 0.8, 0.8) for k in range(20)]
    assert Thresholds(min_same_answer=0.9).check(fidelity(split, n_resamples=20)) == [
        "same answer 0.500 < 0.9"
    ]
    unanswered = [pair(k, None, None) for k in range(4)]
    assert Thresholds().check(fidelity(unanswered, n_resamples=20)) == [
        "same answer: no record answered by either model"
    ]
    assert Thresholds(min_same_answer=0).check(fidelity(unanswered, n_resamples=20)) == []
    with pytest.raises(ValueError, match="at least one record"):
        fidelity([])


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
