"""Aggregate per-record results into the paper's Table 2 figures, the JSON report and a table."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean
from typing import Any

from evaluation.results import RecordResult
from medtpe_core.metrics import (
    auroc,
    bootstrap_f1,
    compression_rate,
    format_compliance_rate,
    pearson,
)
from medtpe_core.tasks import Prediction, Task

MODES = ("original", "medtpe")


def as_target(task: Task, value: Prediction | None) -> bool | list[bool]:
    """A label or prediction as F1 input: a bool (binary) or one bool per label; no answer
    (`None`) is the negative class / no label, so unparsed outputs count as errors."""
    if task.label_type == "binary":
        return bool(value)
    chosen = {value} if isinstance(value, str) else set(value or ())
    return [label in chosen for label in task.labels]


def summarise_mode(
    mode: str,
    task: Task,
    results: Sequence[RecordResult],
    *,
    n_resamples: int = 1000,
    seed: int = 1,
) -> dict[str, Any]:
    """Figures of one mode: bootstrap F1, FCR, AUROC of `p_positive`, latency and prompt tokens
    (and CR for medtpe)."""
    if not results:
        raise ValueError(f"no records evaluated in mode {mode!r}")
    f1_mean, f1_std = bootstrap_f1(
        [as_target(task, r.label) for r in results],
        [as_target(task, r.prediction) for r in results],
        n_resamples=n_resamples,
        seed=seed,
    )
    latencies = [r.latency_s for r in results]
    summary: dict[str, Any] = {
        "n_records": len(results),
        "f1": f1_mean,
        "f1_std": f1_std,
        "fcr": format_compliance_rate([r.format_ok for r in results]),
        **positive_auroc(task, results),
        "latency_s_mean": fmean(latencies),
        "latency_s_total": sum(latencies),
        "generate_s_mean": fmean(r.generate_s for r in results),
        "tokens_mean": fmean(r.n_tokens for r in results),
        "tokens_original_mean": fmean(r.n_tokens_original for r in results),
        "load_avg_1m_mean": fmean(r.load_avg_1m for r in results),
    }
    if mode == "medtpe":
        summary["compression_rate"] = compression_rate(
            sum(r.n_tokens_original for r in results), sum(r.n_tokens for r in results)
        )
    return summary


def positive_auroc(task: Task, results: Sequence[RecordResult]) -> dict[str, Any]:
    """`auroc` of `p_positive` against the labels over the records that have one (binary tasks;
    None when there are none or a class is missing) and `p_positive_n`, how many had one."""
    scored = [r for r in results if r.p_positive is not None]
    value = None
    if task.label_type == "binary" and scored:
        value = auroc([bool(r.label) for r in scored], [r.p_positive for r in scored])
    return {"auroc": value, "p_positive_n": len(scored)}


def positive_shift(
    original: Sequence[RecordResult], medtpe: Sequence[RecordResult]
) -> dict[str, Any]:
    """How MedTPE moves `p_positive`, over the records (matched by key) both modes scored:
    Pearson correlation, mean and max absolute difference (None without such records; the
    correlation also when either side is constant) and `p_positive_pairs`, their number."""
    first = {r.key: r.p_positive for r in original}
    pairs = [
        (p, r.p_positive)
        for r in medtpe
        if r.p_positive is not None and (p := first.get(r.key)) is not None
    ]
    diffs = [abs(b - a) for a, b in pairs]
    return {
        "p_positive_correlation": (
            pearson([a for a, _ in pairs], [b for _, b in pairs]) if pairs else None
        ),
        "p_positive_mae": fmean(diffs) if diffs else None,
        "p_positive_max_abs_diff": max(diffs) if diffs else None,
        "p_positive_pairs": len(pairs),
    }


def agreement(original: Sequence[RecordResult], medtpe: Sequence[RecordResult]) -> float:
    """Share of records on which both modes give the same answer (no answer counts as one).

    Records are matched by key; both runs must cover the same records.
    """
    by_key = {r.key: r.prediction for r in original}
    if set(by_key) != {r.key for r in medtpe} or not by_key:
        raise ValueError("agreement needs both modes evaluated on the same, non-empty records")
    return sum(by_key[r.key] == r.prediction for r in medtpe) / len(medtpe)


def answered_agreement(
    original: Sequence[RecordResult], medtpe: Sequence[RecordResult]
) -> float | None:
    """Among the records the original model answered (its output parsed), the share on which
    MedTPE gives the same answer; None when the original answered none."""
    by_key = {r.key: r for r in medtpe}
    answered = [r for r in original if r.format_ok]
    if not answered:
        return None
    return sum(by_key[r.key].prediction == r.prediction for r in answered) / len(answered)


def build_report(
    task: Task,
    results: dict[str, Sequence[RecordResult]],
    *,
    settings: dict[str, Any],
    n_resamples: int = 1000,
    seed: int = 1,
) -> dict[str, Any]:
    """The JSON report: one summary per evaluated mode, agreement when both ran, the records."""
    report: dict[str, Any] = {"settings": settings}
    for mode in MODES:
        if mode in results:
            report[mode] = summarise_mode(
                mode, task, results[mode], n_resamples=n_resamples, seed=seed
            )
    if all(mode in results for mode in MODES):
        report["agreement"] = agreement(results["original"], results["medtpe"])
        report["agreement_answered"] = answered_agreement(results["original"], results["medtpe"])
        report["latency_reduction"] = 1.0 - (
            report["medtpe"]["latency_s_total"] / report["original"]["latency_s_total"]
        )
        report.update(positive_shift(results["original"], results["medtpe"]))
    report["records"] = {
        mode: [r.to_json() for r in mode_results] for mode, mode_results in results.items()
    }
    return report


def format_table(report: dict[str, Any]) -> str:
    """Plain-text table in the layout of the paper's Table 2 (one row per tokenizer, plus the
    AUROC of `p_positive`), then the comparison of the modes."""
    header = (
        f"{'tokenizer':<10} {'F1':>15} {'FCR':>7} {'AUROC':>6} {'tokens':>8} "
        f"{'latency s':>10} {'total s':>9} {'CR':>7}"
    )
    lines = [header, "-" * len(header)]
    for mode in MODES:
        if mode not in report:
            continue
        row = report[mode]
        cr = f"{row['compression_rate']:.1%}" if "compression_rate" in row else "-"
        f1 = f"{row['f1']:.3f} ± {row['f1_std']:.3f}"
        auc = _figure(row.get("auroc"), ".3f")
        lines.append(
            f"{mode:<10} {f1:>15} {row['fcr']:>7.1%} {auc:>6} {row['tokens_mean']:>8.0f} "
            f"{row['latency_s_mean']:>10.2f} {row['latency_s_total']:>9.1f} {cr:>7}"
        )
    if "agreement" in report:
        answered = report["agreement_answered"]
        lines.append(
            f"latency reduction {report['latency_reduction']:.1%}, "
            f"same answer on {report['agreement']:.1%} of records"
            + (f" ({answered:.1%} of those the original answered)" if answered is not None else "")
        )
    if report.get("p_positive_pairs"):
        lines.append(
            f"p(positive) MedTPE vs original on {report['p_positive_pairs']} records: "
            f"Pearson r {_figure(report['p_positive_correlation'], '.3f')}, "
            f"mean |Δp| {report['p_positive_mae']:.3f}, "
            f"max |Δp| {report['p_positive_max_abs_diff']:.3f}"
        )
    return "\n".join(lines)


def _figure(value: float | None, spec: str) -> str:
    """A figure formatted with `spec`, `-` when undefined."""
    return "-" if value is None else format(value, spec)
