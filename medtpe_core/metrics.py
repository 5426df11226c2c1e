"""Evaluation metrics: F1 (binary; macro over labels for multi-label), bootstrap F1, AUROC,
Pearson correlation, compression rate and format compliance rate (FCR).

F1 conventions (as scikit-learn's defaults): a label with no true and no predicted positives has
F1 = 0. Outputs whose answer did not parse must be mapped by the caller to a prediction first
(the negative class / no labels), so they count as errors, not as missing rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike


def _as_matrix(y: ArrayLike) -> np.ndarray:
    array = np.asarray(y, dtype=bool)
    if array.ndim == 1:
        return array[:, None]
    if array.ndim != 2:
        raise ValueError(
            f"labels must be 1-D (binary) or 2-D (multi-label), got shape {array.shape}"
        )
    return array


def _f1_from_counts(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> np.ndarray:
    denominator = 2 * tp + fp + fn
    return np.divide(
        2 * tp, denominator, out=np.zeros(np.shape(tp), dtype=float), where=denominator > 0
    )


def _pair(y_true: ArrayLike, y_pred: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    true, pred = _as_matrix(y_true), _as_matrix(y_pred)
    if true.shape != pred.shape:
        raise ValueError(f"y_true {true.shape} and y_pred {pred.shape} differ in shape")
    return true, pred


def f1(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Binary F1 of the positive class (1-D input) or macro F1 over labels (2-D, rows x labels)."""
    true, pred = _pair(y_true, y_pred)
    tp = (true & pred).sum(axis=0)
    fp = (~true & pred).sum(axis=0)
    fn = (true & ~pred).sum(axis=0)
    return float(_f1_from_counts(tp, fp, fn).mean())


def bootstrap_f1(
    y_true: ArrayLike, y_pred: ArrayLike, n_resamples: int = 1000, seed: int = 1
) -> tuple[float, float]:
    """(mean, std) of F1 over `n_resamples` resamples of the rows with replacement."""
    true, pred = _pair(y_true, y_pred)
    n = len(true)
    if n == 0:
        raise ValueError("bootstrap needs at least one row")
    rng = np.random.default_rng(seed)
    scores = np.empty(n_resamples)
    for r in range(n_resamples):
        index = rng.integers(0, n, size=n)
        t, p = true[index], pred[index]
        tp = (t & p).sum(axis=0)
        fp = (~t & p).sum(axis=0)
        fn = (t & ~p).sum(axis=0)
        scores[r] = _f1_from_counts(tp, fp, fn).mean()
    return float(scores.mean()), float(scores.std())


def auroc(y_true: ArrayLike, scores: ArrayLike) -> float | None:
    """Area under the ROC curve of `scores` for the boolean labels `y_true`: the probability that
    a random positive scores above a random negative, ties counting one half (Mann-Whitney U).
    None when either class is missing."""
    true = np.asarray(y_true, dtype=bool)
    score = np.asarray(scores, dtype=float)
    if true.shape != score.shape or true.ndim != 1:
        raise ValueError(f"y_true {true.shape} and scores {score.shape} must be equal 1-D shapes")
    positive, negative = score[true], score[~true]
    if not positive.size or not negative.size:
        return None
    pairs = positive[:, None] - negative[None, :]
    return float(((pairs > 0).sum() + 0.5 * (pairs == 0).sum()) / pairs.size)


def pearson(x: ArrayLike, y: ArrayLike) -> float | None:
    """Pearson correlation of two equal-length series; None for fewer than two points or a
    constant series (undefined)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"x {a.shape} and y {b.shape} must be equal 1-D shapes")
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    da, db = a - a.mean(), b - b.mean()
    r = (da * db).sum() / np.sqrt((da * da).sum() * (db * db).sum())
    return float(np.clip(r, -1.0, 1.0))


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
