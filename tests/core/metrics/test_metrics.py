"""F1, AUROC, AUPRC, Brier, ECE (against brute force and scikit-learn, hypothesis where it fits),
patient-level bootstrap intervals and paired differences, agreement, Pearson correlation,
compression rate and FCR."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, brier_score_loss

from medtpe.core.metrics.scores import (
    Interval,
    agreement,
    auprc_scores,
    auroc,
    auroc_scores,
    brier_scores,
    compression_rate,
    ece_scores,
    f1,
    f1_scores,
    format_compliance_rate,
    interval,
    paired_interval,
    pearson,
    pearson_scores,
    subject_resample_weights,
    wrong_prediction,
)
from tests.support.properties import examples

# scores on a coarse grid, so that ties are frequent
SCORED = st.lists(
    st.tuples(st.booleans(), st.integers(0, 10).map(lambda k: k / 10)), min_size=1, max_size=40
)


def test_binary_f1():
    # tp=2, fp=1, fn=1 -> 2*2 / (4+1+1)
    assert f1([1, 1, 1, 0, 0], [1, 1, 0, 1, 0]) == pytest.approx(4 / 6)
    assert f1([0, 0], [0, 0]) == 0.0  # no positives at all: 0, as scikit-learn
    assert f1([True, False], [True, False]) == 1.0


def test_macro_f1_over_labels():
    y_true = np.array([[1, 0, 1], [0, 1, 1], [1, 0, 0]])
    y_pred = np.array([[1, 0, 0], [0, 0, 1], [1, 1, 0]])
    per_label = [1.0, 0.0, 2 * 1 / (2 * 1 + 0 + 1)]
    assert f1(y_true, y_pred) == pytest.approx(np.mean(per_label))


def test_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        f1([1, 0], [1, 0, 1])


def test_compression_rate_and_fcr():
    assert compression_rate(1000, 700) == pytest.approx(0.3)
    assert compression_rate(0, 0) == 0.0
    with pytest.raises(ValueError):
        compression_rate(-1, 0)
    assert format_compliance_rate([True, False, True, True]) == 0.75
    with pytest.raises(ValueError):
        format_compliance_rate([])


def test_auroc_counts_ordered_pairs_and_half_ties():
    # positives 0.9, 0.6 vs negatives 0.4, 0.6: pairs 1 + 1 + 1 + 1/2 of 4
    assert auroc([True, False, True, False], [0.9, 0.4, 0.6, 0.6]) == pytest.approx(0.875)
    assert auroc([1, 0, 1], [0.8, 0.9, 0.95]) == pytest.approx(0.5)
    assert auroc([1, 0], [0.1, 0.9]) == 0.0
    assert auroc([1, 1, 0], [0.5, 0.5, 0.5]) == 0.5  # constant scores: chance


def test_auroc_needs_both_classes():
    assert auroc([True, True], [0.2, 0.3]) is None
    assert auroc([False], [0.2]) is None
    with pytest.raises(ValueError, match="shape"):
        auroc([True, False], [0.2])


def test_pearson():
    # x*30 = 27, 12, 18 (deviations 8, -7, -1); y*30 = 24, 18, 21 (3, -3, 0)
    assert pearson([0.9, 0.4, 0.6], [0.8, 0.6, 0.7]) == pytest.approx(45 / np.sqrt(114 * 18))
    assert pearson([1, 2, 3], [6, 4, 2]) == pytest.approx(-1.0)
    assert pearson([0.7, 0.7, 0.7], [0.1, 0.2, 0.3]) is None  # constant: undefined
    assert pearson([0.5], [0.4]) is None


def test_pearson_scores_weigh_rows_as_repeats():
    x, y = np.array([0.1, 0.5, 0.2, 0.9]), np.array([0.3, 0.2, 0.6, 0.8])
    weights = np.array([[1, 1, 1, 1], [2, 0, 1, 3], [0, 0, 0, 5]])
    scores = pearson_scores(x, y, weights)
    assert scores[0] == pytest.approx(pearson(x, y))
    repeated = np.repeat(np.arange(4), [2, 0, 1, 3])
    assert scores[1] == pytest.approx(pearson(x[repeated], y[repeated]))
    assert np.isnan(scores[2])  # one point drawn five times: undefined


def _brute_force_auroc(true: np.ndarray, score: np.ndarray) -> float | None:
    positives, negatives = score[true], score[~true]
    if not positives.size or not negatives.size:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (positives.size * negatives.size)


@given(SCORED)
@settings(max_examples=examples(200), deadline=None)
def test_auroc_equals_the_pairwise_count(rows: list[tuple[bool, float]]) -> None:
    true = np.array([t for t, _ in rows])
    score = np.array([s for _, s in rows])
    expected = _brute_force_auroc(true, score)
    assert auroc(true, score) == (None if expected is None else pytest.approx(expected))


@given(SCORED)
@settings(max_examples=examples(200), deadline=None)
def test_auprc_and_brier_equal_scikit_learn(rows: list[tuple[bool, float]]) -> None:
    true = np.array([t for t, _ in rows])
    score = np.array([s for _, s in rows])
    assert brier_scores(true, score)[0] == pytest.approx(brier_score_loss(true, score))
    if true.any():
        expected = average_precision_score(true, score)
        assert auprc_scores(true, score)[0] == pytest.approx(expected)
    else:
        assert np.isnan(auprc_scores(true, score)[0])


@given(SCORED, st.lists(st.integers(0, 3), min_size=40, max_size=40))
@settings(max_examples=examples(100), deadline=None)
def test_integer_weights_equal_repeated_rows(
    rows: list[tuple[bool, float]], counts: list[int]
) -> None:
    true = np.array([t for t, _ in rows])
    score = np.array([s for _, s in rows])
    weight = np.array(counts[: len(rows)], dtype=float)
    repeated = np.repeat(np.arange(len(rows)), weight.astype(int))
    for metric in (auroc_scores, auprc_scores, brier_scores, ece_scores):
        weighted = metric(true, score, weights=weight)[0]
        plain = metric(true[repeated], score[repeated])[0] if repeated.size else np.nan
        assert weighted == pytest.approx(plain, nan_ok=True), metric.__name__
    assert f1_scores(true, score > 0.5, weights=weight)[0] == pytest.approx(
        f1_scores(true[repeated], score[repeated] > 0.5)[0] if repeated.size else 0.0
    )


def test_ece_by_hand() -> None:
    # bin [0.2, 0.3): p 0.2, 0.2 outcomes 1, 0 -> |1 - 0.4| = 0.6 ; bin [0.9, 1]: p 1.0, outcome 1
    # -> 0 ; weighted by records: 0.6 / 3
    assert ece_scores([True, False, True], [0.2, 0.2, 1.0])[0] == pytest.approx(0.2)
    assert ece_scores([True, False], [1.0, 0.0])[0] == 0.0  # perfectly calibrated


def test_subject_resample_keeps_a_subjects_records_together() -> None:
    subjects = [7, 7, 7, 3, 9, 9]
    weights = subject_resample_weights(subjects, n_resamples=500, seed=1)
    assert weights.shape == (500, 6)
    assert (weights[:, 0] == weights[:, 1]).all() and (weights[:, 1] == weights[:, 2]).all()
    assert (weights[:, 4] == weights[:, 5]).all()
    # three subjects drawn three times per resample, whatever their number of records
    assert (weights[:, [0, 3, 4]].sum(axis=1) == 3).all()
    assert (subject_resample_weights(subjects, 500, seed=1) == weights).all()
    assert not (subject_resample_weights(subjects, 500, seed=2) == weights).all()


def test_interval_brackets_the_figure_and_narrows_with_more_patients() -> None:
    rng = np.random.default_rng(0)

    def auroc_interval(n: int) -> Interval:
        true = rng.random(n) < 0.3
        score = np.clip(0.3 * true + rng.random(n) * 0.7, 0, 1)
        weights = subject_resample_weights(np.arange(n), n_resamples=1000, seed=1)
        return interval(auroc_scores, true, score, weights=weights)

    small, large = auroc_interval(60), auroc_interval(2000)
    for figure in (small, large):
        assert figure.low <= figure.value <= figure.high
        assert figure.n_resamples == 1000
    assert large.high - large.low < small.high - small.low


def test_undefined_figures_have_no_interval() -> None:
    weights = subject_resample_weights([1, 2], n_resamples=50)
    figure = interval(auroc_scores, [True, True], [0.1, 0.9], weights=weights)
    assert figure == Interval(None, None, None, 0)


def test_paired_difference_of_a_predictor_with_itself_is_zero() -> None:
    rng = np.random.default_rng(1)
    true = rng.random(50) < 0.4
    first = rng.random(50)
    second = np.where(true, first + 0.3, first)  # strictly better ranking
    weights = subject_resample_weights(np.arange(50) // 2, n_resamples=300)
    same = paired_interval(auroc_scores, (true, first), (true, first), weights=weights)
    assert same.value == same.low == same.high == 0.0
    better = paired_interval(auroc_scores, (true, first), (true, second), weights=weights)
    assert better.value > 0 and better.low >= 0.0


def test_wrong_prediction_and_agreement() -> None:
    assert wrong_prediction([True, False]).tolist() == [False, True]
    result = agreement([True, None, False, True], [True, False, False, False], [1, 0, 1, 1])
    assert result == {"agreement": 0.5, "agreement_answered": pytest.approx(2 / 3)}
    assert agreement([None], [None], [False]) == {"agreement": 1.0, "agreement_answered": None}
    with pytest.raises(ValueError, match="same"):
        agreement([True], [True, False], [True])
