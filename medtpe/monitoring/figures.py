"""The report's figures of a set of predictions (a slice: a week, a site, a subgroup): counts,
flag rate at the operating threshold, AUROC and AUPRC with patient-level bootstrap intervals,
calibration (ECE, logistic slope and intercept, reliability curve), sensitivity and PPV at the
threshold, override rate by reason, latency p50/p95; the threshold sweep; the shadow pairs.

Discrimination and calibration are computed on the predictions whose outcome is `known` and that
have a p("yes"); the other figures on every prediction of the slice."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from medtpe.core.metrics.scores import (
    ECE_BINS,
    INTERVAL_LEVEL,
    Interval,
    auprc_scores,
    auroc_scores,
    ece_scores,
)

if TYPE_CHECKING:
    from medtpe.monitoring.frame import Monitored

DEFAULT_RESAMPLES = 200
"""Bootstrap resamples per slice (the report computes many slices; 200 keeps a 10,000-row report
within seconds while the 2.5th/97.5th percentiles stay stable to about ±0.01)."""
SWEEP = tuple(round(t, 2) for t in np.arange(0.05, 1.0, 0.05))
"""The thresholds of the alert-burden sweep."""
P_CLIP = 1e-6
FEW_OUTCOMES = 10
"""Fewer known positives or negatives than this: too few to judge discrimination."""
OVERRIDDEN = "overridden"
BOOTSTRAP_BLOCK_BYTES = 32 * 2**20
"""The most bytes of resample weights held at once: a slice's resamples are drawn and scored a
block at a time (the same draws as all at once; the ECE's last digit may differ by a rounding),
so a slice of millions of predictions costs about 7 times this (the metrics' sorted copies), not
resamples x rows x 8 bytes that many times."""


def _number(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def calibration_fit(label: np.ndarray, p: np.ndarray, iterations: int = 50) -> dict[str, Any]:
    """Calibration intercept and slope: the logistic regression of the outcome on logit(p),
    unpenalised, by Newton's method (None where undefined: one class, a constant p, or a
    separation that makes the fit diverge). A calibrated model has slope 1 and intercept 0."""
    y = np.asarray(label, dtype=float)
    x = np.log(np.clip(p, P_CLIP, 1 - P_CLIP) / (1 - np.clip(p, P_CLIP, 1 - P_CLIP)))
    undefined = {"intercept": None, "slope": None}
    if len(y) < 2 or y.min() == y.max() or np.ptp(x) < 1e-9:
        return undefined
    design = np.column_stack([np.ones_like(x), x])
    beta = np.zeros(2)
    for _ in range(iterations):
        fitted = 1 / (1 + np.exp(-(design @ beta)))
        weight = fitted * (1 - fitted)
        hessian = design.T @ (design * weight[:, None])
        try:
            step = np.linalg.solve(hessian, design.T @ (y - fitted))
        except np.linalg.LinAlgError:
            return undefined
        beta = beta + step
        if not np.all(np.isfinite(beta)) or np.abs(beta).max() > 1e6:
            return undefined
        if np.abs(step).max() < 1e-10:
            break
    return {"intercept": float(beta[0]), "slope": float(beta[1])}


def reliability_curve(label: np.ndarray, p: np.ndarray) -> list[dict[str, Any]]:
    """Per `ECE_BINS` equal-width bin of p with predictions: mean p, observed outcome rate, n
    (the bins the ECE weighs)."""
    bins = np.minimum((np.clip(p, 0, 1) * ECE_BINS).astype(int), ECE_BINS - 1)
    curve = []
    for b in range(ECE_BINS):
        inside = bins == b
        if inside.any():
            curve.append(
                {
                    "low": b / ECE_BINS,
                    "high": (b + 1) / ECE_BINS,
                    "mean_p": float(p[inside].mean()),
                    "observed": float(label[inside].mean()),
                    "n": int(inside.sum()),
                }
            )
    return curve


def _rate(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    if not len(values):
        return {"p50": None, "p95": None}
    p50, p95 = np.percentile(values, [50, 95])
    return {"p50": float(p50), "p95": float(p95)}


@dataclass(frozen=True)
class Slicer:
    """Computes slice figures over one monitored set with its per-row flags."""

    data: Monitored
    flagged: np.ndarray
    """Whether each row's p("yes") reaches its threshold (False without a p)."""
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 1

    def figures(self, rows: np.ndarray) -> dict[str, Any]:
        """The figures of the rows `rows` (indices)."""
        d = self.data
        p, label, flagged = d.p_yes[rows], d.label[rows], self.flagged[rows]
        scored = ~np.isnan(p)
        known = ~np.isnan(label) & scored
        y, score = label[known].astype(bool), p[known]
        status = Counter(d.status[rows])
        figures: dict[str, Any] = {
            "n": len(rows),
            "scored": int(scored.sum()),
            "flagged": int(flagged.sum()),
            "flag_rate": _rate(int(flagged.sum()), int(scored.sum())),
            "outcomes": {
                "known": int(status["known"]),
                "open": int(status["open"]),
                "no_label": int(status["no_label"]),
                "not_joined": int(status[""]),
                "positives": int(y.sum()),
                "negatives": int((~y).sum()),
            },
            "prevalence": float(y.mean()) if len(y) else None,
            "sensitivity": _rate(int((flagged[known] & y).sum()), int(y.sum())),
            "ppv": _rate(int((flagged[known] & y).sum()), int(flagged[known].sum())),
            **self._discrimination(y, score, d.subject_id[rows][known]),
            "calibration": calibration_fit(y, score),
            "reliability": reliability_curve(y.astype(float), score),
            "latency_ms": _percentiles(d.latency_ms[rows]),
            "overrides": self._overrides(rows),
        }
        return figures

    def _discrimination(
        self, y: np.ndarray, score: np.ndarray, subjects: np.ndarray
    ) -> dict[str, Any]:
        empty = {"value": None, "low": None, "high": None, "n_resamples": 0}
        if not len(y):
            return {"auroc": empty, "auprc": empty, "ece": empty}
        metrics = {"auroc": auroc_scores, "auprc": auprc_scores, "ece": ece_scores}
        samples: dict[str, list[np.ndarray]] = {name: [] for name in metrics}
        for weights in resample_blocks(subjects, self.resamples, self.seed):
            for name, metric in metrics.items():
                samples[name].append(metric(y, score, weights=weights))
        return {
            name: Interval.from_samples(
                metric(y, score)[0], np.concatenate(samples[name])
            ).to_json()
            for name, metric in metrics.items()
        }

    def _overrides(self, rows: np.ndarray) -> dict[str, Any]:
        cards = [
            c for pid in self.data.prediction_id[rows] for c in self.data.feedback.get(pid, [])
        ]
        overridden = [reason for outcome, reason in cards if outcome == OVERRIDDEN]
        reasons = Counter(reason or "(no reason given)" for reason in overridden)
        return {
            "feedback": len(cards),
            "overridden": len(overridden),
            "override_rate": _rate(len(overridden), len(cards)),
            "by_reason": {
                reason: {"n": n, "share_of_feedback": n / len(cards)}
                for reason, n in reasons.most_common()
            },
        }


def resample_blocks(
    subjects: np.ndarray, resamples: int, seed: int, block_bytes: int = BOOTSTRAP_BLOCK_BYTES
) -> Iterator[np.ndarray]:
    """The patient-level bootstrap weights of `medtpe.core.metrics.scores.
    subject_resample_weights` (the same subjects, seed and draws), `block_bytes` of weights at
    a time: (resamples in the block, rows) arrays, all resamples in all."""
    found, row_subject = np.unique(subjects.astype(str), return_inverse=True)
    rng = np.random.default_rng(seed)
    chances = np.full(len(found), 1 / len(found))
    block = max(1, block_bytes // (8 * max(1, len(subjects))))
    for first in range(0, resamples, block):
        draws = rng.multinomial(len(found), chances, min(block, resamples - first))
        yield draws[:, row_subject].astype(float)


def verdict(figures: dict[str, Any]) -> str:
    """What the AUROC and its interval say, in one plain sentence."""
    auroc = figures["auroc"]
    outcomes = figures["outcomes"]
    level = f"{INTERVAL_LEVEL:.0%}"
    if auroc["value"] is None:
        return (
            f"Discrimination cannot be measured: the known outcomes hold {outcomes['positives']} "
            f"positive(s) and {outcomes['negatives']} negative(s) (both are needed)."
        )
    text = f"AUROC {auroc['value']:.3f}"
    if auroc["low"] is not None:
        text += f" ({level} CI {auroc['low']:.3f}–{auroc['high']:.3f})"
    few = min(outcomes["positives"], outcomes["negatives"]) < FEW_OUTCOMES
    caveat = (
        f" Only {outcomes['positives']} positive and {outcomes['negatives']} negative outcomes are "
        "known: the interval is wide and the estimate unstable."
        if few
        else ""
    )
    if auroc["low"] is None or auroc["low"] <= 0.5 <= auroc["high"]:
        return (
            f"The model does not discriminate: {text} covers 0.5, what ranking patients at "
            f"random gives. Its flags should not be relied on to find the patients with the "
            f"outcome.{caveat}"
        )
    if auroc["high"] < 0.5:
        return f"The model ranks worse than chance: {text} lies below 0.5.{caveat}"
    return f"The model discriminates better than chance: {text} lies above 0.5.{caveat}"


def period_days(created_at: np.ndarray, since: datetime | None, until: datetime | None) -> float:
    """Days the report covers: `since` to `until` where given, else the first to the last
    prediction (at least one day)."""
    if not len(created_at) and (since is None or until is None):
        return 1.0
    start = np.datetime64(since.replace(tzinfo=None), "us") if since else created_at.min()
    end = np.datetime64(until.replace(tzinfo=None), "us") if until else created_at.max()
    return max(1.0, float((end - start) / np.timedelta64(1, "D")))


def threshold_sweep(
    p: np.ndarray, label: np.ndarray, days: float, thresholds: tuple[float, ...] = SWEEP
) -> list[dict[str, Any]]:
    """Alert burden against sensitivity and PPV at each threshold: alerts per day over every
    scored prediction of the period; sensitivity and PPV over those with a known outcome."""
    scored = ~np.isnan(p)
    known = scored & ~np.isnan(label)
    y = label[known].astype(bool)
    sweep = []
    for threshold in thresholds:
        alerts = int((p[scored] >= threshold).sum())
        flagged = p[known] >= threshold
        true_positives = int((flagged & y).sum())
        sweep.append(
            {
                "threshold": threshold,
                "alerts": alerts,
                "alerts_per_day": alerts / days,
                "flag_rate": _rate(alerts, int(scored.sum())),
                "sensitivity": _rate(true_positives, int(y.sum())),
                "ppv": _rate(true_positives, int(flagged.sum())),
            }
        )
    return sweep


def iso_week(when: datetime | date) -> str:
    """The ISO week of a time, e.g. `2026-W48`."""
    year, week, _ = when.isocalendar()
    return f"{year}-W{week:02d}"


def shadow_pairs(data: Monitored, rows: np.ndarray, weeks: np.ndarray) -> dict[str, Any] | None:
    """Agreement and |Δp| of each shadow row with the row it shadows, overall and by week (None
    when there is no shadow row)."""
    if not len(rows):
        return None
    originals = data.positions(data.shadow_of[rows])
    pairs = [(r, int(o)) for r, o in zip(rows, originals, strict=True) if o >= 0]
    by_week: dict[str, list[tuple[int, int]]] = {}
    for shadow, original in pairs:
        by_week.setdefault(str(weeks[shadow]), []).append((shadow, original))

    def summary(chosen: list[tuple[int, int]]) -> dict[str, Any]:
        same = [data.answer[s] == data.answer[o] for s, o in chosen]
        gaps = np.array([abs(data.p_yes[s] - data.p_yes[o]) for s, o in chosen])
        gaps = gaps[~np.isnan(gaps)]
        return {
            "n": len(chosen),
            "agreement": float(np.mean(same)) if same else None,
            "mean_abs_dp": float(gaps.mean()) if len(gaps) else None,
            "p95_abs_dp": float(np.percentile(gaps, 95)) if len(gaps) else None,
        }

    return {
        "rows": len(rows),
        "unpaired": int(len(rows) - len(pairs)),
        **summary(pairs),
        "by_week": [{"week": w, **summary(c)} for w, c in sorted(by_week.items())],
    }


def clean(value: Any) -> Any:
    """`value` with every non-finite float as None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, float):
        return _number(value)
    return value
