"""Research figures on paired fidelity readings (docs/research/fidelity-log.md): what a drift of
the answer's probability is made of, beyond the product's own figures
(`medtpe.core.metrics.fidelity`).

- `paired_difference`, `paired_r_difference`: two artefacts answering the same records, the
  difference of their mean |Δp| or of their logits' correlation with the original's, with a
  patient-level paired bootstrap interval;
- `logit_shift`: the drift in the logit, one shared shift or a spread;
- `logit_agreement`: how much of the original's record-to-record variation the MedTPE model
  keeps (Pearson r of the logits) against reading no record at all;
- `rounding_parts`: a served dtype's |Δp| split into the rows' own error and the two prompts'
  roundings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from medtpe.core.metrics.fidelity import PairedAnswer, bootstrap_figure, weighted_mean
from medtpe.core.metrics.scores import (
    DEFAULT_RESAMPLES,
    Interval,
    interval,
    paired_interval,
    pearson_scores,
    subject_resample_weights,
)


def paired_difference(
    first: Sequence[PairedAnswer],
    second: Sequence[PairedAnswer],
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 1,
) -> dict[str, Any]:
    """Mean |Δp| of `second` minus that of `first`, two artefacts answering the same records
    (same order), on the records where both have a |Δp|, with its patient-level paired
    bootstrap interval (one draw of patients for both sides), as JSON.

    >>> a = [PairedAnswer(1, 1, 1, {"yes": 0.8}, {"yes": 0.7})]
    >>> b = [PairedAnswer(1, 1, 1, {"yes": 0.8}, {"yes": 0.75})]
    >>> round(paired_difference(a, b, n_resamples=10)["value"], 3)
    -0.05
    """
    _check_paired(first, second)
    both = [
        k
        for k, (a, b) in enumerate(zip(first, second, strict=True))
        if None not in (a.delta_p, b.delta_p)
    ]
    if not both:
        return Interval(None, None, None, 0).to_json() | {"n": 0}
    diff = np.array([second[k].delta_p - first[k].delta_p for k in both])
    weights = subject_resample_weights([first[k].subject_id for k in both], n_resamples, seed)
    value = float(diff.mean())
    figure = Interval.from_samples(value, weighted_mean(diff, weights)).to_json()
    return figure | {
        "n": len(both),
        "n_better": int((diff < 0).sum()),
        "n_worse": int((diff > 0).sum()),
    }


def _check_paired(first: Sequence[PairedAnswer], second: Sequence[PairedAnswer]) -> None:
    """`ValueError` unless both artefacts answered the same records in the same order."""
    if [p.subject_id for p in first] != [p.subject_id for p in second]:
        raise ValueError("paired artefacts must answer the same records in the same order")


def logit_shift(
    pairs: Sequence[PairedAnswer],
    option: str,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 1,
) -> dict[str, Any]:
    """What the drift of `option`'s probability is made of, as JSON: the signed change
    (MedTPE - original) and on how many records it is negative; the shift of its logit
    (original - MedTPE) with a patient-level bootstrap interval of its mean, and its spread;
    and the mean |Δp| left once the records' mean logit shift is added to every MedTPE logit
    (fitted on these same records: what a constant correction could do at best). A drift made of
    one shared shift has a small spread and little left; noise has a mean shift near 0. Also the
    mean |shift| with its interval, and the original's mean p(1 - p), the slope of p in the
    logit: the same logit error moves p more where the original is less sure, so |Δp| can grow
    between record sets (e.g. prompt lengths) whose logit error does not.

    >>> pairs = [PairedAnswer(k, 1, 1, {"yes": 0.9}, {"yes": 0.8}) for k in range(4)]
    >>> shape = logit_shift(pairs, "yes", n_resamples=10)
    >>> round(shape["shift_mean"]["value"], 3), shape["n_lower"], round(shape["residual_mean"], 6)
    (0.811, 4, 0.0)
    """
    subjects, original, medtpe = _option_probs(pairs, option)
    if not len(subjects):
        return {"n": 0}
    shift = _logit(original) - _logit(medtpe)
    weights = subject_resample_weights(list(subjects), n_resamples, seed)
    corrected = _sigmoid(_logit(medtpe) + shift.mean())
    return {
        "n": len(subjects),
        "signed_mean": float((medtpe - original).mean()),
        "n_lower": int((medtpe < original).sum()),
        "shift_mean": Interval.from_samples(
            float(shift.mean()), weighted_mean(shift, weights)
        ).to_json(),
        "shift_sd": float(shift.std()),
        "abs_shift_mean": Interval.from_samples(
            float(np.abs(shift).mean()), weighted_mean(np.abs(shift), weights)
        ).to_json(),
        "sensitivity_mean": float((original * (1 - original)).mean()),
        "residual_mean": float(np.abs(corrected - original).mean()),
    }


def _has_logit(pair: PairedAnswer, option: str) -> bool:
    """Both models give `option` a probability strictly between 0 and 1."""
    return bool(pair.probs_original and pair.probs_medtpe) and all(
        0 < probs.get(option, 0) < 1 for probs in (pair.probs_original, pair.probs_medtpe)
    )


def _option_probs(
    pairs: Sequence[PairedAnswer], option: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(subjects, original p, MedTPE p) of `option` on the records `_has_logit`."""
    kept = [p for p in pairs if _has_logit(p, option)]
    subjects = np.array([p.subject_id for p in kept], dtype=int)
    original = np.array([p.probs_original[option] for p in kept], dtype=float)
    medtpe = np.array([p.probs_medtpe[option] for p in kept], dtype=float)
    return subjects, original, medtpe


def logit_agreement(
    pairs: Sequence[PairedAnswer],
    option: str,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 1,
) -> dict[str, Any]:
    """How much of the original model's record-to-record variation of `option`'s probability
    the MedTPE model keeps, as JSON: the Pearson r of the two models' logits over the records
    (what a ranking, and so AUROC, reads) with its patient-level bootstrap interval; each side's
    logit SD across records; and `constant_delta_p_mean`, the mean |Δp| of reading no record at
    all (each record given the original's mean logit over the other patients' records). Where
    the original's probability barely varies between records, a mean |Δp| near that constant's
    says the MedTPE probability follows the record no better than ignoring it; r tells them apart.

    >>> pairs = [PairedAnswer(k, 1, 1, {"yes": p}, {"yes": p - 0.05}) for k, p in
    ...          enumerate([0.6, 0.7, 0.8, 0.9])]
    >>> agreement = logit_agreement(pairs, "yes", n_resamples=10)
    >>> round(agreement["r"]["value"], 3), round(agreement["constant_delta_p_mean"], 3)
    (0.999, 0.135)
    """
    subjects, p_original, p_medtpe = _option_probs(pairs, option)
    if len(np.unique(subjects)) < 2:
        return {"n": len(subjects)}
    original, medtpe = _logit(p_original), _logit(p_medtpe)
    weights = subject_resample_weights(list(subjects), n_resamples, seed)
    others = np.array([original[subjects != s].mean() for s in subjects])
    return {
        "n": len(subjects),
        "r": interval(pearson_scores, original, medtpe, weights=weights).to_json(),
        "sd_original": float(original.std()),
        "sd_medtpe": float(medtpe.std()),
        "constant_delta_p_mean": float(np.abs(_sigmoid(others) - p_original).mean()),
    }


def paired_r_difference(
    first: Sequence[PairedAnswer],
    second: Sequence[PairedAnswer],
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 1,
    option: str = "yes",
) -> dict[str, Any]:
    """The r of `second` minus that of `first` (`logit_agreement`), two artefacts answering the
    same records (same order), on the records where both have `option`'s logits, with its
    patient-level paired bootstrap interval, as JSON."""
    _check_paired(first, second)
    keep = [
        k
        for k, (a, b) in enumerate(zip(first, second, strict=True))
        if _has_logit(a, option) and _has_logit(b, option)
    ]
    if len({first[k].subject_id for k in keep}) < 2:
        return Interval(None, None, None, 0).to_json() | {"n": len(keep)}
    subjects, *first_p = _option_probs([first[k] for k in keep], option)
    _, *second_p = _option_probs([second[k] for k in keep], option)
    weights = subject_resample_weights(list(subjects), n_resamples, seed)
    difference = paired_interval(
        pearson_scores, [_logit(p) for p in first_p], [_logit(p) for p in second_p], weights=weights
    )
    return difference.to_json() | {"n": len(keep)}


def rounding_parts(
    exact: Sequence[PairedAnswer],
    served: Sequence[PairedAnswer],
    option: str = "yes",
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 1,
) -> dict[str, Any]:
    """What the served dtype's |Δp| is made of, as JSON: the same records (same order) read
    by both models in float32 (`exact`) and in the served dtype (`served`), on the records where
    all four give `option` a logit. In the logit, the served error (MedTPE served - original
    served) is the rows' own error (float32) plus the MedTPE prompt's rounding minus the
    original's; each part's mean and SD, the correlation of the two roundings with its
    patient-level interval, and the served SD the three would give if independent. Then mean
    |Δp| with intervals: the engine's floor (the original served against itself in float32),
    the served error, the served MedTPE against the float32 original, and `perfect_rows`: rows
    with no float32 error under the MedTPE prompt's measured rounding (the float32 original's
    logit plus that rounding) against the served original. Two prompts of different tokens are
    rounded differently: where the roundings are independent and as large, perfect rows sit
    near √2 times the floor in the logit, so no rows reach a served |Δp| below that.

    Rows with no float32 error are perfect rows:

    >>> exact = [PairedAnswer(k, 1, 1, {"yes": 0.8}, {"yes": 0.8}) for k in range(4)]
    >>> served = [PairedAnswer(k, 1, 1, {"yes": 0.78}, {"yes": 0.7 + 0.05 * (k % 2)})
    ...           for k in range(4)]
    >>> parts = rounding_parts(exact, served, n_resamples=10)
    >>> parts["n"], parts["sd"]["rows"], round(parts["floor"]["value"], 3)
    (4, 0.0, 0.02)
    >>> round(parts["served"]["value"], 3), round(parts["perfect_rows"]["value"], 3)
    (0.055, 0.055)
    """
    _check_paired(exact, served)
    keep = [
        k
        for k, (a, b) in enumerate(zip(exact, served, strict=True))
        if _has_logit(a, option) and _has_logit(b, option)
    ]
    if not keep:
        return {"n": 0}
    subjects, o32, m32 = _option_probs([exact[k] for k in keep], option)
    _, o16, m16 = _option_probs([served[k] for k in keep], option)
    lo32, lm32, lo16, lm16 = map(_logit, (o32, m32, o16, m16))
    parts = {
        "rows": lm32 - lo32,
        "original_rounding": lo16 - lo32,
        "medtpe_rounding": lm16 - lm32,
        "served": lm16 - lo16,
    }
    weights = subject_resample_weights(list(subjects), n_resamples, seed)
    floor = bootstrap_figure(np.abs(o16 - o32), weights, "mean")
    figures = {
        name: bootstrap_figure(np.abs(medtpe - original), weights, "mean")
        for name, medtpe, original in (
            ("served", m16, o16),
            ("served_against_exact", m16, o32),
            ("perfect_rows", _sigmoid(lo32 + parts["medtpe_rounding"]), o16),
        )
    }
    return {
        "n": len(keep),
        "mean": {name: float(v.mean()) for name, v in parts.items()},
        "sd": {name: float(v.std()) for name, v in parts.items()},
        "independent_sd": float(
            np.sqrt(sum(parts[p].var() for p in ("rows", "original_rounding", "medtpe_rounding")))
        ),
        "rounding_r": interval(
            pearson_scores,
            parts["original_rounding"],
            parts["medtpe_rounding"],
            weights=weights,
        ).to_json(),
        "floor": floor,
        **figures,
        "to_floor": {
            name: f["value"] / floor["value"] if floor["value"] else None
            for name, f in figures.items()
        },
    }


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p / (1 - p))
