"""Aggregate per-record results into the paper's Table 2 figures, the JSON report and a table.

Quality figures carry patient-level bootstrap intervals (`medtpe.core.metrics.scores`): F1 for every
task (an unparsed answer counts as wrong, as in the paper), and for binary tasks AUROC, AUPRC,
Brier score and ECE of `p_yes`. A record without `p_yes` (no first token spelled an
option) scores `UNSCORED_PROBABILITY` (labels, predictions and scores as the predictions file
reads them: `medtpe.core.meds.predictions_file`). With both modes, the paired differences
MedTPE - original (ΔF1, ΔAUROC, ΔAUPRC) come from the same resampled patients for both modes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import Any

import numpy as np

from medtpe.core.meds.prediction_point import subject_of
from medtpe.core.meds.predictions_file import labels_matrix, positive_scores, scored_predictions
from medtpe.core.metrics.fidelity import PairedAnswer, fidelity
from medtpe.core.metrics.scores import (
    DEFAULT_RESAMPLES,
    SCORE_METRICS,
    Interval,
    agreement,
    compression_rate,
    f1_scores,
    format_compliance_rate,
    interval,
    paired_interval,
    pearson,
    subject_resample_weights,
)
from medtpe.core.tasks import Task
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.report_schema import EvaluationReport, Fidelity, ModeSummary

MODES = ("original", "medtpe")
PAIRED_METRICS = ("auroc", "auprc")


def resample_weights(
    results: Sequence[RecordResult], n_resamples: int = DEFAULT_RESAMPLES, seed: int = 1
) -> np.ndarray:
    """Patient-level bootstrap weights for these records (subjects from their keys)."""
    return subject_resample_weights([subject_of(r.key) for r in results], n_resamples, seed)


def quality(task: Task, results: Sequence[RecordResult], weights: np.ndarray) -> dict[str, Any]:
    """F1 (and, for binary tasks, AUROC, AUPRC, Brier, ECE of p_yes) with intervals, the
    number of positive labels and of records scored with a probability."""
    labels = labels_matrix(task, results)
    f1 = interval(f1_scores, labels, scored_predictions(task, results), weights=weights)
    figures: dict[str, Any] = {"f1": f1.to_json(), "n_positive": int(labels.sum())}
    if task.label_type == "binary":
        scores = positive_scores(results)
        for name, metric in SCORE_METRICS.items():
            figures[name] = interval(metric, labels, scores, weights=weights).to_json()
        figures["p_yes_n"] = sum(r.p_yes is not None for r in results)
    return figures


def summarise_mode(
    mode: str, task: Task, results: Sequence[RecordResult], *, weights: np.ndarray | None = None
) -> ModeSummary:
    """Figures of one mode: quality with intervals, FCR, latency and prompt tokens (and CR for
    medtpe). `weights`: the bootstrap's (default: a patient-level one of these records)."""
    if not results:
        raise ValueError(f"no records evaluated in mode {mode!r}")
    weights = resample_weights(results) if weights is None else weights
    latencies = [r.latency_s for r in results]
    summary: dict[str, Any] = {
        "n_records": len(results),
        "n_subjects": len({subject_of(r.key) for r in results}),
        **quality(task, results, weights),
        "fcr": format_compliance_rate([r.format_ok for r in results]),
        "latency_s_mean": fmean(latencies),
        "latency_s_total": sum(latencies),
        "generate_s_mean": fmean(r.generate_s for r in results),
        "tokens_mean": fmean(r.n_tokens for r in results),
        "original_tokens_mean": fmean(r.original_tokens for r in results),
        "load_avg_1m_mean": fmean(r.load_avg_1m for r in results),
    }
    if mode == "medtpe":
        summary["compression_rate"] = compression_rate(
            sum(r.original_tokens for r in results), sum(r.n_tokens for r in results)
        )
    return ModeSummary.model_validate(summary)


def aligned(original: Sequence[RecordResult], medtpe: Sequence[RecordResult]) -> list[RecordResult]:
    """MedTPE's results in the order of the original's records (both must cover the same)."""
    by_key = {r.key: r for r in medtpe}
    if set(by_key) != {r.key for r in original} or not by_key:
        raise ValueError("both modes must be evaluated on the same, non-empty records")
    return [by_key[r.key] for r in original]


def paired_differences(
    task: Task,
    original: Sequence[RecordResult],
    medtpe: Sequence[RecordResult],
    weights: np.ndarray,
) -> dict[str, Any]:
    """ΔF1 (and ΔAUROC, ΔAUPRC for binary tasks), MedTPE - original, on the same resamples."""
    medtpe = aligned(original, medtpe)
    labels = labels_matrix(task, original)
    deltas = {
        "delta_f1": paired_interval(
            f1_scores,
            (labels, scored_predictions(task, original)),
            (labels, scored_predictions(task, medtpe)),
            weights=weights,
        )
    }
    if task.label_type == "binary":
        for name in PAIRED_METRICS:
            deltas[f"delta_{name}"] = paired_interval(
                SCORE_METRICS[name],
                (labels, positive_scores(original)),
                (labels, positive_scores(medtpe)),
                weights=weights,
            )
    return {name: value.to_json() for name, value in deltas.items()}


def mode_agreement(
    original: Sequence[RecordResult], medtpe: Sequence[RecordResult]
) -> dict[str, float | None]:
    """Same answer on all records, and on those the original answered (`metrics.agreement`)."""
    medtpe = aligned(original, medtpe)
    return agreement(
        [r.prediction for r in original],
        [r.prediction for r in medtpe],
        [r.format_ok for r in original],
    )


def paired_answers(
    original: Sequence[RecordResult], medtpe: Sequence[RecordResult]
) -> list[PairedAnswer]:
    """Each record's answers under both modes (matched by key), first samples' text and end."""
    pairs = []
    for first, second in zip(original, aligned(original, medtpe), strict=True):
        pairs.append(
            PairedAnswer(
                subject_id=subject_of(first.key),
                original=first.prediction,
                medtpe=second.prediction,
                probs_original=first.probabilities,
                probs_medtpe=second.probabilities,
                text_original=first.outputs[0] if first.outputs else "",
                text_medtpe=second.outputs[0] if second.outputs else "",
                finish_original=first.finishes[0] if first.finishes else "",
                finish_medtpe=second.finishes[0] if second.finishes else "",
                generated_original=first.n_generated,
                generated_medtpe=second.n_generated,
                format_ok_original=first.format_ok,
                format_ok_medtpe=second.format_ok,
                trailing_original=any(first.trailing),
                trailing_medtpe=any(second.trailing),
            )
        )
    return pairs


def positive_shift(
    original: Sequence[RecordResult], medtpe: Sequence[RecordResult]
) -> dict[str, Any]:
    """How MedTPE moves `p_yes`, over the records (matched by key) both modes scored:
    Pearson correlation, mean and max absolute difference (None without such records; the
    correlation also when either side is constant) and `p_yes_pairs`, their number."""
    first = {r.key: r.p_yes for r in original}
    pairs = [
        (p, r.p_yes) for r in medtpe if r.p_yes is not None and (p := first.get(r.key)) is not None
    ]
    diffs = [abs(b - a) for a, b in pairs]
    return {
        "p_yes_correlation": (
            pearson([a for a, _ in pairs], [b for _, b in pairs]) if pairs else None
        ),
        "p_yes_mae": fmean(diffs) if diffs else None,
        "p_yes_max_abs_diff": max(diffs) if diffs else None,
        "p_yes_pairs": len(pairs),
    }


def build_report(
    task: Task,
    results: dict[str, Sequence[RecordResult]],
    *,
    settings: dict[str, Any],
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 1,
) -> EvaluationReport:
    """The report: with both modes, fidelity first (`medtpe.core.metrics.fidelity`); one summary per
    evaluated mode; with both, their paired differences, agreement, latency reduction and
    p_yes shift; the records."""
    figures: dict[str, Any] = {"settings": settings | {"bootstrap_resamples": n_resamples}}
    first = next(iter(results.values()))
    both = all(mode in results for mode in MODES)
    if both:
        pairs = paired_answers(results["original"], results["medtpe"])
        figures["fidelity"] = fidelity(pairs, n_resamples, seed)
    weights = resample_weights(first, n_resamples, seed)
    for mode in MODES:
        if mode in results:
            ordered = aligned(first, results[mode])
            figures[mode] = summarise_mode(mode, task, ordered, weights=weights)
    if both:
        original, medtpe = results["original"], results["medtpe"]
        figures.update(paired_differences(task, original, medtpe, weights))
        figures.update(mode_agreement(original, medtpe))
        figures["latency_reduction"] = 1.0 - (
            figures["medtpe"].latency_s_total / figures["original"].latency_s_total
        )
        figures.update(positive_shift(original, medtpe))
    figures["records"] = {mode: list(mode_results) for mode, mode_results in results.items()}
    return EvaluationReport(**figures)


def with_interval(figure: Interval | Mapping[str, Any] | float | None, spec: str = ".3f") -> str:
    """`value [low, high]` of an interval (or of its JSON object; a plain number, as reports
    before the intervals give F1, as itself), `-` when undefined."""
    if isinstance(figure, Mapping):
        figure = Interval(**figure)
    if isinstance(figure, float | int):
        return format(figure, spec)
    if figure is None or figure.value is None:
        return "-"
    text = format(figure.value, spec)
    if figure.low is not None:
        text += f" [{figure.low:{spec}}, {figure.high:{spec}}]"
    return text


def format_table(report: EvaluationReport) -> str:
    """Plain-text table in the layout of the paper's Table 2 (one row per tokenizer) with the
    quality figures and their 95 % intervals, then the comparison of the modes."""
    names = ("f1", "auroc", "auprc", "brier", "ece")
    header = f"{'tokenizer':<10} {'FCR':>7} {'tokens':>8} {'latency s':>10} {'CR':>7}"
    lines = fidelity_lines(report.fidelity) if report.fidelity is not None else []
    lines += [header, "-" * len(header)]
    for mode in MODES:
        row = report.mode(mode)
        if row is None:
            continue
        cr = "-" if row.compression_rate is None else f"{row.compression_rate:.1%}"
        lines.append(
            f"{mode:<10} {row.fcr:>7.1%} {row.tokens_mean:>8.0f} "
            f"{row.latency_s_mean:>10.2f} {cr:>7}"
        )
        figures = ", ".join(
            f"{n} {with_interval(getattr(row, n))}" for n in names if getattr(row, n) is not None
        )
        lines.append(f"  {figures} ({row.n_positive} positive labels)")
    if report.agreement is not None:
        answered = report.agreement_answered
        deltas = ", ".join(
            f"{name[len('delta_') :]} {with_interval(getattr(report, name), '+.3f')}"
            for name in ("delta_f1", "delta_auroc", "delta_auprc")
            if getattr(report, name) is not None
        )
        lines.append(f"MedTPE - original: {deltas}")
        lines.append(
            f"latency reduction {report.latency_reduction:.1%}, "
            f"same answer on {report.agreement:.1%} of records"
            + (f" ({answered:.1%} of those the original answered)" if answered is not None else "")
        )
    if report.p_yes_pairs:
        lines.append(
            f"p(yes) MedTPE vs original on {report.p_yes_pairs} records: "
            f"Pearson r {_figure(report.p_yes_correlation, '.3f')}, "
            f"mean |Δp| {report.p_yes_mae:.3f}, "
            f"max |Δp| {report.p_yes_max_abs_diff:.3f}"
        )
    return "\n".join(lines)


def fidelity_lines(figures: Fidelity) -> list[str]:
    """The fidelity figures (`medtpe.core.metrics.fidelity.fidelity`) as text, intervals in
    brackets."""
    generated = figures.generated_tokens_mean
    fcr, trailing = figures.fcr_strict, figures.trailing_text
    return [
        f"Fidelity, MedTPE vs original on {figures.n_records} records "
        f"({figures.n_subjects} patients):",
        f"  same answer {with_interval(figures.same_answer)}; answers given: "
        f"original {figures.answer_counts['original']}, "
        f"MedTPE {figures.answer_counts['medtpe']}",
        f"  |Δp| mean {with_interval(figures.delta_p_mean, '.4f')}, "
        f"p95 {with_interval(figures.delta_p_p95, '.4f')}, "
        f"KL {with_interval(figures.kl_mean, '.4f')} ({figures.delta_p_n} records)",
        f"  same stop {figures.same_stop:.1%}; generated tokens "
        f"{generated['original']:.1f} -> {generated['medtpe']:.1f}; strict FCR "
        f"{fcr['original']:.1%} -> {fcr['medtpe']:.1%}; text after the answer "
        f"{trailing['original']} -> {trailing['medtpe']}",
        "",
    ]


def _figure(value: float | None, spec: str) -> str:
    """A figure formatted with `spec`, `-` when undefined."""
    return "-" if value is None else format(value, spec)
