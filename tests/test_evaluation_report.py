"""The evaluation report's maths on hand-made per-record results: FCR, latency, tokens, CR,
agreement, AUROC and the shift of p_positive between modes, the JSON shape, the printed table
and results written before p_positive existed."""

from __future__ import annotations

import json
import math

import pytest

from evaluation.report import (
    agreement,
    answered_agreement,
    as_target,
    build_report,
    format_table,
    positive_auroc,
    positive_shift,
    summarise_mode,
)
from evaluation.results import RecordResult, record_key
from medtpe_core.metrics import bootstrap_f1
from medtpe_core.tasks import get_task

MORTALITY = get_task("icu_mortality")
PHENOTYPING = get_task("phenotyping")


def result(
    i: int,
    label: object,
    prediction: object,
    *,
    ok: bool = True,
    latency: float = 1.0,
    tokens: int = 100,
    original: int = 100,
    p: float | None = None,
) -> RecordResult:
    """One hand-made record result (`p`: its p_positive)."""
    return RecordResult(
        key=record_key(i, "2150-03-02T08:00:00"),
        label=label,
        prediction=prediction,
        format_ok=ok,
        latency_s=latency,
        generate_s=0.9 * latency,
        n_tokens=tokens,
        n_tokens_original=original,
        probabilities=None if p is None else {"yes": p, "no": 1 - p},
        p_positive=p,
    )


ORIGINAL = [
    result(1, True, True, latency=4.0, tokens=1000, original=1000, p=0.9),
    result(2, False, False, latency=2.0, tokens=600, original=600, p=0.4),
    result(3, True, None, ok=False, latency=3.0, tokens=800, original=800, p=0.6),
    result(4, False, True, latency=3.0, tokens=600, original=600, p=0.6),
]
MEDTPE = [  # record 4: no top token spelled an option (no p_positive)
    result(1, True, True, latency=2.0, tokens=700, original=1000, p=0.8),
    result(2, False, False, latency=1.0, tokens=400, original=600, p=0.6),
    result(3, True, None, ok=False, latency=1.5, tokens=500, original=800, p=0.7),
    result(4, False, False, latency=1.5, tokens=400, original=600),
]


def test_summary_figures() -> None:
    summary = summarise_mode("medtpe", MORTALITY, MEDTPE)
    assert summary["n_records"] == 4
    assert summary["fcr"] == pytest.approx(0.75)
    assert summary["latency_s_total"] == pytest.approx(6.0)
    assert summary["latency_s_mean"] == pytest.approx(1.5)
    assert summary["generate_s_mean"] == pytest.approx(0.9 * 1.5)
    assert summary["tokens_mean"] == pytest.approx(500.0)
    assert summary["tokens_original_mean"] == pytest.approx(750.0)
    assert summary["compression_rate"] == pytest.approx(1 - 2000 / 3000)
    assert "compression_rate" not in summarise_mode("original", MORTALITY, ORIGINAL)


def test_f1_counts_unparsed_answers_as_negative() -> None:
    # record 3: positive label, no answer -> a false negative, not a dropped row
    summary = summarise_mode("original", MORTALITY, ORIGINAL, n_resamples=200, seed=3)
    expected = bootstrap_f1([True, False, True, False], [True, False, False, True], 200, seed=3)
    assert (summary["f1"], summary["f1_std"]) == pytest.approx(expected)


def test_targets_for_binary_and_multilabel() -> None:
    assert as_target(MORTALITY, None) is False
    assert as_target(MORTALITY, True) is True
    first, third = PHENOTYPING.labels[0], PHENOTYPING.labels[2]
    vector = as_target(PHENOTYPING, [first, third])
    assert vector[0] and vector[2] and sum(vector) == 2
    assert as_target(PHENOTYPING, None) == [False] * len(PHENOTYPING.labels)


def test_agreement_counts_equal_answers_including_no_answer() -> None:
    # records 1, 2 equal; 3 both unparsed (same: no answer); 4 differs
    assert agreement(ORIGINAL, MEDTPE) == pytest.approx(0.75)


def test_answered_agreement_ignores_records_the_original_did_not_answer() -> None:
    # original answered records 1, 2, 4; MedTPE agrees on 1 and 2
    assert answered_agreement(ORIGINAL, MEDTPE) == pytest.approx(2 / 3)
    unanswered = [result(i, True, None, ok=False) for i in range(3)]
    assert answered_agreement(unanswered, unanswered) is None


def test_agreement_needs_the_same_records() -> None:
    with pytest.raises(ValueError, match="same"):
        agreement(ORIGINAL, MEDTPE[:3])


def test_report_json_shape() -> None:
    report = build_report(
        MORTALITY, {"original": ORIGINAL, "medtpe": MEDTPE}, settings={"task": "icu_mortality"}
    )
    decoded = json.loads(json.dumps(report))
    required = {"f1", "f1_std", "fcr", "latency_s_mean", "latency_s_total", "tokens_mean"}
    assert required <= set(decoded["original"])
    assert required | {"compression_rate"} <= set(decoded["medtpe"])
    assert decoded["agreement"] == pytest.approx(0.75)
    assert decoded["agreement_answered"] == pytest.approx(2 / 3)
    assert decoded["latency_reduction"] == pytest.approx(1 - 6.0 / 12.0)
    assert decoded["original"]["auroc"] == pytest.approx(0.875)
    assert decoded["medtpe"]["auroc"] == pytest.approx(1.0)
    assert decoded["p_positive_mae"] == pytest.approx(0.4 / 3)
    assert decoded["records"]["medtpe"][0]["probabilities"] == pytest.approx(
        {"yes": 0.8, "no": 0.2}
    )
    assert decoded["records"]["medtpe"][3]["p_positive"] is None
    assert [r["key"] for r in decoded["records"]["medtpe"]] == [r.key for r in MEDTPE]


def test_single_mode_report_has_no_agreement() -> None:
    report = build_report(MORTALITY, {"medtpe": MEDTPE}, settings={})
    assert "original" not in report and "agreement" not in report


def test_table_lists_both_modes_and_the_comparison() -> None:
    report = build_report(MORTALITY, {"original": ORIGINAL, "medtpe": MEDTPE}, settings={})
    table = format_table(report)
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["tokenizer", "F1", "FCR"]
    original_row = next(line for line in lines if line.startswith("original"))
    medtpe_row = next(line for line in lines if line.startswith("medtpe"))
    assert "75.0%" in original_row and original_row.rstrip().endswith("-")
    assert medtpe_row.rstrip().endswith("33.3%")
    assert "latency reduction 50.0%" in table and "75.0% of records" in table
    assert "66.7% of those the original answered" in table
    assert lines[0].split()[3] == "AUROC"
    assert original_row.split()[5] == "0.875" and medtpe_row.split()[5] == "1.000"
    assert "p(positive) MedTPE vs original on 3 records: Pearson r 0.993" in table
    assert "mean |Δp| 0.133, max |Δp| 0.200" in table


def test_auroc_of_p_positive_per_mode() -> None:
    # original: positives 0.9, 0.6 vs negatives 0.4, 0.6 -> (1 + 1 + 1 + 1/2) / 4
    assert positive_auroc(MORTALITY, ORIGINAL) == {"auroc": 0.875, "p_positive_n": 4}
    # medtpe: record 4 has no p_positive; positives 0.8, 0.7 vs negative 0.6 -> 1
    assert positive_auroc(MORTALITY, MEDTPE) == {"auroc": 1.0, "p_positive_n": 3}
    one_class = [result(i, True, True, p=0.5) for i in range(3)]
    assert positive_auroc(MORTALITY, one_class)["auroc"] is None
    unscored = [result(1, True, True), result(2, False, False)]
    assert positive_auroc(MORTALITY, unscored) == {"auroc": None, "p_positive_n": 0}


def test_p_positive_shift_between_modes() -> None:
    # records 1-3 scored in both: (0.9, 0.8), (0.4, 0.6), (0.6, 0.7); x*30 - mean: 8, -7, -1;
    # y*30 - mean: 3, -3, 0
    shift = positive_shift(ORIGINAL, MEDTPE)
    assert shift["p_positive_pairs"] == 3
    assert shift["p_positive_correlation"] == pytest.approx(45 / math.sqrt(114 * 18))
    assert shift["p_positive_mae"] == pytest.approx(0.4 / 3)
    assert shift["p_positive_max_abs_diff"] == pytest.approx(0.2)
    constant = [result(i, True, True, p=0.7) for i in (1, 2)]
    moved = [result(1, True, True, p=0.6), result(2, True, True, p=0.9)]
    assert positive_shift(constant, moved)["p_positive_correlation"] is None
    assert positive_shift(constant, moved)["p_positive_mae"] == pytest.approx(0.15)


def test_results_without_p_positive_still_load_and_report() -> None:
    # a record as written before p_positive existed (bench_eval_compare.py loads rows like this)
    row = MEDTPE[0].to_json()
    del row["probabilities"], row["p_positive"]
    old = RecordResult(**row)
    assert old.p_positive is None and old.probabilities is None
    rows = [RecordResult(**{**row, "key": record_key(i, "x")}) for i in range(2)]
    report = build_report(MORTALITY, {"original": rows, "medtpe": rows}, settings={})
    assert report["original"]["auroc"] is None and report["p_positive_pairs"] == 0
    assert report["p_positive_correlation"] is None and report["p_positive_mae"] is None
    table = format_table(report)
    assert "p(positive)" not in table
    assert next(line for line in table.splitlines() if line.startswith("medtpe")).split()[5] == "-"
