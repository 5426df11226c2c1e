"""Evaluation metrics with patient-level bootstrap intervals, compression rate, FCR, agreement.

Every score metric takes row weights: a 1-D array (one evaluation) or a 2-D array with one row
of weights per bootstrap resample, and then returns one value per resample, all computed at once
(no Python loop over resamples). A patient-level resample draws subjects with replacement and
gives each row its subject's draw count as weight (`subject_resample_weights`), so a subject's
records stay together. Paired differences between two predictors of the same records use the
same weights for both (`paired_interval`).

Conventions:
- F1: binary F1 of the positive class (1-D input) or macro F1 over labels (2-D, rows x labels);
  a label with no true and no predicted positives has F1 = 0 (scikit-learn's default). Answers
  that did not parse must be mapped to a wrong prediction by the caller (`wrong_prediction`).
- AUROC: the probability that a positive scores above a negative, ties counting one half
  (Mann-Whitney U); undefined (None / NaN) when a class is missing.
- AUPRC: average precision, `sum_n (R_n - R_{n-1}) P_n` over descending distinct thresholds
  (scikit-learn's `average_precision_score`).
- Brier score: mean squared difference of probability and outcome.
- ECE: expected calibration error over `ECE_BINS` equal-width probability bins, each bin
  weighted by its share of records (meds-evaluation's `calibration_error` is the unweighted mean
  over non-empty bins of scikit-learn's calibration curve, so the two differ).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

ECE_BINS = 10
DEFAULT_RESAMPLES = 1000
INTERVAL_LEVEL = 0.95

ScoreMetric = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""(y_true bool (n,), scores float (n,), weights (R, n)) -> one value per weight row."""


def _as_matrix(y: ArrayLike) -> np.ndarray:
    array = np.asarray(y, dtype=bool)
    if array.ndim == 1:
        return array[:, None]
    if array.ndim != 2:
        raise ValueError(
            f"labels must be 1-D (binary) or 2-D (multi-label), got shape {array.shape}"
        )
    return array


def _pair(y_true: ArrayLike, y_pred: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    true, pred = _as_matrix(y_true), _as_matrix(y_pred)
    if true.shape != pred.shape:
        raise ValueError(f"y_true {true.shape} and y_pred {pred.shape} differ in shape")
    return true, pred


def _weight_rows(weights: ArrayLike | None, n: int) -> np.ndarray:
    """Weights as a 2-D (resamples, n) float array; None means one evaluation of every row."""
    if weights is None:
        return np.ones((1, n))
    rows = np.atleast_2d(np.asarray(weights, dtype=float))
    if rows.shape[1] != n:
        raise ValueError(f"weights of shape {rows.shape} do not fit {n} rows")
    return rows


def _scored(y_true: ArrayLike, scores: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    true = np.asarray(y_true, dtype=bool)
    score = np.asarray(scores, dtype=float)
    if true.shape != score.shape or true.ndim != 1:
        raise ValueError(f"y_true {true.shape} and scores {score.shape} must be equal 1-D shapes")
    return true, score


def _divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, NaN where the denominator is 0."""
    out = np.full(np.shape(numerator), np.nan)
    return np.divide(numerator, denominator, out=out, where=denominator > 0)


def f1_scores(y_true: ArrayLike, y_pred: ArrayLike, weights: ArrayLike | None = None) -> np.ndarray:
    """F1 (binary) or macro F1 (multi-label) per weight row."""
    true, pred = _pair(y_true, y_pred)
    w = _weight_rows(weights, len(true))
    tp = w @ (true & pred)
    fp = w @ (~true & pred)
    fn = w @ (true & ~pred)
    denominator = 2 * tp + fp + fn
    per_label = np.divide(
        2 * tp, denominator, out=np.zeros_like(denominator), where=denominator > 0
    )
    return per_label.mean(axis=1)


def f1(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Binary F1 of the positive class (1-D input) or macro F1 over labels (2-D)."""
    return float(f1_scores(y_true, y_pred)[0])


def _class_weights_by_score(
    true: np.ndarray, score: np.ndarray, w: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(positive, negative) weight per distinct score, ascending: two (R, G) arrays (summed over
    each run of equal scores in score order: memory R x n, not n x G)."""
    if not len(score):
        return np.zeros((len(w), 0)), np.zeros((len(w), 0))
    order = np.argsort(score, kind="stable")
    ordered = score[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    sorted_w, sorted_true = w[:, order], true[order]
    positive = np.add.reduceat(sorted_w * sorted_true, starts, axis=1)
    return positive, np.add.reduceat(sorted_w * ~sorted_true, starts, axis=1)


def auroc_scores(
    y_true: ArrayLike, scores: ArrayLike, weights: ArrayLike | None = None
) -> np.ndarray:
    """AUROC per weight row (NaN where a class has no weight)."""
    true, score = _scored(y_true, scores)
    w = _weight_rows(weights, len(true))
    positive, negative = _class_weights_by_score(true, score, w)
    below = np.cumsum(negative, axis=1) - negative
    wins = (positive * (below + 0.5 * negative)).sum(axis=1)
    return _divide(wins, positive.sum(axis=1) * negative.sum(axis=1))


def auroc(y_true: ArrayLike, scores: ArrayLike) -> float | None:
    """AUROC of `scores` for the boolean labels; None when either class is missing."""
    value = auroc_scores(y_true, scores)[0]
    return None if np.isnan(value) else float(value)


def auprc_scores(
    y_true: ArrayLike, scores: ArrayLike, weights: ArrayLike | None = None
) -> np.ndarray:
    """Average precision per weight row (NaN where there is no positive weight)."""
    true, score = _scored(y_true, scores)
    w = _weight_rows(weights, len(true))
    positive, negative = _class_weights_by_score(true, score, w)
    positive, negative = positive[:, ::-1], negative[:, ::-1]  # highest threshold first
    tp, fp = np.cumsum(positive, axis=1), np.cumsum(negative, axis=1)
    precision = np.divide(tp, tp + fp, out=np.zeros_like(tp), where=(tp + fp) > 0)
    return _divide((positive * precision).sum(axis=1), positive.sum(axis=1))


def brier_scores(
    y_true: ArrayLike, scores: ArrayLike, weights: ArrayLike | None = None
) -> np.ndarray:
    """Brier score per weight row."""
    true, score = _scored(y_true, scores)
    w = _weight_rows(weights, len(true))
    return _divide(w @ (score - true) ** 2, w.sum(axis=1))


def ece_scores(
    y_true: ArrayLike, scores: ArrayLike, weights: ArrayLike | None = None
) -> np.ndarray:
    """Expected calibration error (`ECE_BINS` equal-width bins) per weight row."""
    true, score = _scored(y_true, scores)
    w = _weight_rows(weights, len(true))
    bins = np.minimum((np.clip(score, 0.0, 1.0) * ECE_BINS).astype(int), ECE_BINS - 1)
    onehot = np.zeros((len(score), ECE_BINS))
    onehot[np.arange(len(score)), bins] = 1.0
    gaps = np.abs((w * (true - score)) @ onehot).sum(axis=1)
    return _divide(gaps, w.sum(axis=1))


SCORE_METRICS: dict[str, ScoreMetric] = {
    "auroc": auroc_scores,
    "auprc": auprc_scores,
    "brier": brier_scores,
    "ece": ece_scores,
}
"""The metrics of a probability of the positive class, by report name."""


def subject_resample_weights(
    subject_ids: Sequence[int], n_resamples: int = DEFAULT_RESAMPLES, seed: int = 1
) -> np.ndarray:
    """(n_resamples, n_rows) weights: each resample draws the subjects with replacement, and a
    row's weight is how often its subject was drawn."""
    subjects, row_subject = np.unique(np.asarray(subject_ids), return_inverse=True)
    if not len(subjects):
        raise ValueError("a bootstrap needs at least one record")
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(len(subjects), np.full(len(subjects), 1 / len(subjects)), n_resamples)
    return draws[:, row_subject].astype(float)


@dataclass(frozen=True)
class Interval:
    """A figure with its bootstrap percentile interval; None where undefined. `n_resamples` counts
    the resamples on which the figure was defined (e.g. both classes drawn)."""

    value: float | None
    low: float | None
    high: float | None
    n_resamples: int

    @classmethod
    def from_samples(cls, value: float, samples: np.ndarray) -> Interval:
        """The figure `value` with the central `INTERVAL_LEVEL` interval of `samples`."""
        defined = samples[~np.isnan(samples)]
        if not defined.size:
            return cls(_finite(value), None, None, 0)
        tail = (1 - INTERVAL_LEVEL) / 2 * 100
        low, high = np.percentile(defined, [tail, 100 - tail])
        return cls(_finite(value), float(low), float(high), int(defined.size))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def _finite(value: float) -> float | None:
    return None if np.isnan(value) else float(value)


def interval(
    metric: Callable[..., np.ndarray], *arrays: ArrayLike, weights: np.ndarray
) -> Interval:
    """`metric(*arrays)` on all rows and on each weight row of `weights`."""
    return Interval.from_samples(metric(*arrays)[0], metric(*arrays, weights=weights))


def paired_interval(
    metric: Callable[..., np.ndarray],
    first: Sequence[ArrayLike],
    second: Sequence[ArrayLike],
    *,
    weights: np.ndarray,
) -> Interval:
    """The difference `metric(*second) - metric(*first)` on the same records and the same
    resamples (paired bootstrap)."""
    value = metric(*second)[0] - metric(*first)[0]
    return Interval.from_samples(
        value, metric(*second, weights=weights) - metric(*first, weights=weights)
    )


def wrong_prediction(label: np.ndarray) -> np.ndarray:
    """The prediction an unparsed answer counts as: wrong on every label (as the paper)."""
    return ~np.asarray(label, dtype=bool)


def agreement(
    first: Sequence[object], second: Sequence[object], first_answered: Sequence[bool]
) -> dict[str, float | None]:
    """Share of records on which two predictors give the same answer (no answer counts as one
    answer), over all records (`agreement`) and over those the first one answered
    (`agreement_answered`, None when it answered none). Sequences are aligned by record."""
    if not (len(first) == len(second) == len(first_answered)) or not first:
        raise ValueError("agreement needs both predictors on the same, non-empty records")
    same = np.array([a == b for a, b in zip(first, second, strict=True)], dtype=bool)
    answered = np.asarray(first_answered, dtype=bool)
    return {
        "agreement": float(same.mean()),
        "agreement_answered": float(same[answered].mean()) if answered.any() else None,
    }


def pearson_scores(x: ArrayLike, y: ArrayLike, weights: ArrayLike | None = None) -> np.ndarray:
    """Pearson correlation of two equal-length series per weight row (each row's weights as
    repeat counts); NaN where a row leaves fewer than two points or a constant series."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"x {a.shape} and y {b.shape} must be equal 1-D shapes")
    w = _weight_rows(weights, len(a))
    total = w.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        da, db = a - (w @ a)[:, None] / total, b - (w @ b)[:, None] / total
        covariance = (w * da * db).sum(axis=1)
        spread = np.sqrt((w * da * da).sum(axis=1) * (w * db * db).sum(axis=1))
        tiny = 1e-12 * np.sqrt((w * a * a).sum(axis=1) * (w * b * b).sum(axis=1))
        r = np.where(spread > tiny, covariance / spread, np.nan)
    return np.clip(r, -1.0, 1.0)


def pearson(x: ArrayLike, y: ArrayLike) -> float | None:
    """Pearson correlation of two equal-length series; None for fewer than two points or a
    constant series (undefined)."""
    return _finite(pearson_scores(x, y)[0])


def compression_rate(original: int, compressed: int) -> float:
    """1 - compressed / original (share of tokens removed); 0 for an empty original."""
    if original < 0 or compressed < 0:
        raise ValueError("token counts must be non-negative")
    return 0.0 if original == 0 else 1.0 - compressed / original


def format_compliance_rate(format_ok: Sequence[bool]) -> float:
    """Share of outputs whose answer parsed (FCR)."""
    if not format_ok:
        raise ValueError("FCR of no outputs is undefined")
    return float(np.mean(np.asarray(format_ok, dtype=bool)))
