"""F1, bootstrap F1, AUROC, Pearson correlation, compression rate and FCR."""

from __future__ import annotations

import numpy as np
import pytest

from medtpe_core.metrics import (
    auroc,
    bootstrap_f1,
    compression_rate,
    f1,
    format_compliance_rate,
    pearson,
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


def test_bootstrap_is_seeded_and_centred():
    rng = np.random.default_rng(0)
    y_true = rng.integers(0, 2, 400)
    y_pred = np.where(rng.random(400) < 0.8, y_true, 1 - y_true)
    mean, std = bootstrap_f1(y_true, y_pred, n_resamples=1000, seed=1)
    assert (mean, std) == bootstrap_f1(y_true, y_pred, n_resamples=1000, seed=1)
    assert mean == pytest.approx(f1(y_true, y_pred), abs=0.01)
    assert 0.005 < std < 0.05
    assert bootstrap_f1(y_true, y_pred, seed=2) != (mean, std)


def test_bootstrap_multilabel():
    y = np.eye(4, dtype=int)[[0, 1, 2, 3] * 10]
    mean, std = bootstrap_f1(y, y, n_resamples=200)
    assert mean > 0.99 and std < 0.05


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
