"""The answer contract over generated model outputs (property tests), the stop rule's ids under
both tokenizers, and the paired fidelity figures on hand-computed cases."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from medtpe.core.metrics.fidelity import PairedAnswer, Thresholds, fidelity
from medtpe.core.tasks import get_task
from medtpe.core.tasks.answers import (
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
