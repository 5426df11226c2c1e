"""Fidelity: does the MedTPE model answer as the original model does, record by record?

The paired figures of one set of records answered by both models (same prompts, the original
one under the base tokenizer and the MedTPE one under MedTPE), with patient-level bootstrap
intervals (`medtpe.core.metrics.scores.subject_resample_weights`):

- `same_answer`: share of the records that at least one model answered (`n_answered` of them)
  with the same prediction: a record neither model answers says nothing of agreement;
- `delta_p_mean`, `delta_p_p95`: mean and 95th percentile over records of |Δp|, the largest
  change of an answer option's probability (binary tasks: |Δp(yes)|), on the records where both
  models put probability on some option (`delta_p_n` of them);
- `kl_mean`: mean KL(original ‖ MedTPE) of the answer options' distribution at the answer's
  first token (nats, each side smoothed by `KL_FLOOR`);
- `same_stop`: share of records whose answers end the same way (end of sequence, the stop rule
  or the token limit) at the same character;
- generated tokens per record of both, strict format compliance of both, and how many answers
  wrote text after their answer object.

`check` holds a report against `Thresholds` (the build's fidelity gate). When a model gives the
same answer to every record, `same_answer` only says MedTPE does too: `answer_counts` shows it.

>>> pair = PairedAnswer(1, True, True, {"yes": 0.8, "no": 0.2}, {"yes": 0.7, "no": 0.3})
>>> round(fidelity([pair], n_resamples=10)["delta_p_mean"]["value"], 3)
0.1
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from medtpe.core.metrics.scores import (
    DEFAULT_RESAMPLES,
    Interval,
    subject_resample_weights,
)

KL_FLOOR = 1e-6
"""Probability given to an option one side did not rank, before renormalising (KL stays finite)."""
P95 = 95


@dataclass(frozen=True)
class PairedAnswer:
    """One record answered by both models."""

    subject_id: int
    original: Any
    """The original model's prediction (None: no answer)."""
    medtpe: Any
    probs_original: Mapping[str, float] | None = None
    """{answer option: probability} at the answer's first token (None: not measured)."""
    probs_medtpe: Mapping[str, float] | None = None
    text_original: str = ""
    text_medtpe: str = ""
    finish_original: str = ""
    finish_medtpe: str = ""
    generated_original: int = 0
    generated_medtpe: int = 0
    format_ok_original: bool = True
    format_ok_medtpe: bool = True
    trailing_original: bool = False
    trailing_medtpe: bool = False

    @property
    def same_answer(self) -> bool:
        """Both models give the same prediction."""
        return self.original == self.medtpe

    @property
    def same_stop(self) -> bool:
        """Both answers end the same way at the same character."""
        return (self.finish_original, self.text_original) == (self.finish_medtpe, self.text_medtpe)

    @property
    def delta_p(self) -> float | None:
        """The largest |Δp| over the answer options; None unless both sides have probabilities."""
        if not self.probs_original or not self.probs_medtpe:
            return None
        options = set(self.probs_original) | set(self.probs_medtpe)
        return max(
            abs(self.probs_original.get(o, 0.0) - self.probs_medtpe.get(o, 0.0)) for o in options
        )

    @property
    def kl(self) -> float | None:
        """KL(original ‖ MedTPE) over the answer options; None unless both have probabilities."""
        if not self.probs_original or not self.probs_medtpe:
            return None
        options = sorted(set(self.probs_original) | set(self.probs_medtpe))
        p = np.array([max(self.probs_original.get(o, 0.0), KL_FLOOR) for o in options])
        q = np.array([max(self.probs_medtpe.get(o, 0.0), KL_FLOOR) for o in options])
        p, q = p / p.sum(), q / q.sum()
        return float(np.sum(p * np.log(p / q)))


def weighted_mean(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The mean of `values` under each row of `weights` (NaN where a row weighs nothing)."""
    totals = weights.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (weights * values).sum(axis=1) / totals


def _weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """The `q`-th percentile of `values` with each row of integer `weights` as repeat counts."""
    out = np.full(len(weights), np.nan)
    for row, w in enumerate(weights):
        drawn = np.repeat(values, w.astype(int))
        if drawn.size:
            out[row] = np.percentile(drawn, q)
    return out


def bootstrap_figure(
    values: Sequence[float], weights: np.ndarray, statistic: str
) -> dict[str, Any]:
    """`statistic` (`mean` or `p95`) of `values` with its bootstrap interval, as JSON."""
    data = np.asarray(values, dtype=float)
    if not data.size:
        return Interval(None, None, None, 0).to_json()
    whole = np.ones((1, data.size))
    if statistic == "mean":
        value, samples = weighted_mean(data, whole)[0], weighted_mean(data, weights)
    else:
        value = _weighted_percentile(data, whole, P95)[0]
        samples = _weighted_percentile(data, weights, P95)
    return Interval.from_samples(value, samples).to_json()


def fidelity(
    pairs: Sequence[PairedAnswer], n_resamples: int = DEFAULT_RESAMPLES, seed: int = 1
) -> dict[str, Any]:
    """The paired fidelity figures of `pairs` (see the module docstring), as JSON."""
    if not pairs:
        raise ValueError("fidelity needs at least one record answered by both models")
    weights = subject_resample_weights([p.subject_id for p in pairs], n_resamples, seed)
    scored = [k for k, p in enumerate(pairs) if p.delta_p is not None]
    answered = [k for k, p in enumerate(pairs) if (p.original, p.medtpe) != (None, None)]
    sub = weights[:, scored]
    n = len(pairs)
    generated = {
        side: sum(getattr(p, f"generated_{side}") for p in pairs) / n
        for side in ("original", "medtpe")
    }
    return {
        "n_records": n,
        "n_subjects": len({p.subject_id for p in pairs}),
        "same_answer": bootstrap_figure(
            [float(pairs[k].same_answer) for k in answered], weights[:, answered], "mean"
        ),
        "n_answered": len(answered),
        "delta_p_mean": bootstrap_figure([pairs[k].delta_p for k in scored], sub, "mean"),
        "delta_p_p95": bootstrap_figure([pairs[k].delta_p for k in scored], sub, "p95"),
        "delta_p_n": len(scored),
        "kl_mean": bootstrap_figure([pairs[k].kl for k in scored], sub, "mean"),
        "same_stop": sum(p.same_stop for p in pairs) / n,
        "generated_tokens_mean": generated,
        "generated_tokens_ratio": (
            generated["medtpe"] / generated["original"] if generated["original"] else None
        ),
        "fcr_strict": {
            "original": sum(p.format_ok_original for p in pairs) / n,
            "medtpe": sum(p.format_ok_medtpe for p in pairs) / n,
        },
        "trailing_text": {
            "original": sum(p.trailing_original for p in pairs),
            "medtpe": sum(p.trailing_medtpe for p in pairs),
        },
        "answer_counts": {
            "original": _counts(p.original for p in pairs),
            "medtpe": _counts(p.medtpe for p in pairs),
        },
        "bootstrap_resamples": n_resamples,
    }


def _counts(predictions: Any) -> dict[str, int]:
    """How often each answer was given (JSON keys: the answers' JSON spelling)."""
    counts = Counter(
        "null" if p is None else str(p).lower() if isinstance(p, bool) else str(p)
        for p in predictions
    )
    return dict(sorted(counts.items()))


@dataclass(frozen=True)
class Thresholds:
    """The fidelity gate: the least same-answer rate and the largest mean |Δp| a build keeps
    (0.03: what the default method, rows distilled under the RoPE stretch, reaches through vLLM
    on 32 held-out windows at 4,096 and 8,192 tokens, 0.021 and 0.027; docs/benchmarks.md)."""

    min_same_answer: float = 0.95
    max_delta_p_mean: float = 0.03

    def check(self, report: Mapping[str, Any]) -> list[str]:
        """Why `report` (of `fidelity`) fails the gate; empty when it passes. With no record
        answered by either model the same-answer rate is undefined: a failure, unless
        `min_same_answer` is 0 (nothing asked of the answers)."""
        failures = []
        same = report["same_answer"]["value"]
        if same is None and self.min_same_answer > 0:
            failures.append("same answer: no record answered by either model")
        elif same is not None and same < self.min_same_answer:
            failures.append(f"same answer {same:.3f} < {self.min_same_answer}")
        delta = report["delta_p_mean"]["value"]
        if delta is not None and delta > self.max_delta_p_mean:
            failures.append(f"mean |Δp| {delta:.4f} > {self.max_delta_p_mean}")
        return failures
