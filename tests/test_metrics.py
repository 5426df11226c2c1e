"""F1, bootstrap F1, compression rate and FCR."""

from __future__ import annotations

import numpy as np
import pytest

from medtpe_core.metrics import bootstrap_f1, compression_rate, f1, format_compliance_rate


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
