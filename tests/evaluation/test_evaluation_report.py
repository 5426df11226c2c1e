"""The evaluation report's maths on hand-made per-record results: FCR, latency, tokens, CR,
agreement, quality figures with intervals, paired differences, the shift of p_yes between
modes, the JSON shape, the printed table and results written before p(yes) was recorded."""

from __future__ import annotations

import json
import math

import pytest

from medtpe.core.meds.prediction_point import record_key
from medtpe.core.metrics.scores import f1
from medtpe.core.tasks import get_task
from medtpe.evaluation.figures import (
    build_report,
    format_table,
    mode_agreement,
    paired_differences,
    positive_shift,
    quality,
    resample_weights,
    summarise_mode,
)
from medtpe.evaluation.record_result import RecordResult

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
    """One hand-made record result (`p`: its p_yes)."""
    return RecordResult(
        key=record_key(i, "2150-03-02T08:00:00"),
        label=label,
        prediction=prediction,
        format_ok=ok,
        latency_s=latency,
        generate_s=0.9 * latency,
        n_tokens=tokens,
        original_tokens=original,
        probabilities=None if p is None else {"yes": p, "no": 1 - p},
        p_yes=p,
    )


ORIGINAL = [
    result(1, True, True, latency=4.0, tokens=1000, original=1000, p=0.9),
    result(2, False, False, latency=2.0, tokens=600, original=600, p=0.4),
    result(3, True, None, ok=False, latency=3.0, tokens=800, original=800, p=0.6),
    result(4, False, True, latency=3.0, tokens=600, original=600, p=0.6),
]
MEDTPE = [  # record 4: no top token spelled an option (no p_yes)
    result(1, True, True, latency=2.0, tokens=700, original=1000, p=0.8),
    result(2, False, False, latency=1.0, tokens=400, original=600, p=0.6),
    result(3, True, None, ok=False, latency=1.5, tokens=500, original=800, p=0.7),
    result(4, False, False, latency=1.5, tokens=400, original=600),
]


def test_summary_figures() -> None:
    summary = summarise_mode("medtpe", MORTALITY, MEDTPE)
    assert summary.n_records == 4
    assert summary.fcr == pytest.approx(0.75)
    assert summary.latency_s_total == pytest.approx(6.0)
    assert summary.latency_s_mean == pytest.approx(1.5)
    assert summary.generate_s_mean == pytest.approx(0.9 * 1.5)
    assert summary.tokens_mean == pytest.approx(500.0)
    assert summary.original_tokens_mean == pytest.approx(750.0)
    assert summary.compression_rate == pytest.approx(1 - 2000 / 3000)
    assert summarise_mode("original", MORTALITY, ORIGINAL).compression_rate is None


def test_f1_counts_unparsed_answers_as_wrong() -> None:
    # record 3: positive label, no answer -> wrong (a false negative); record 5: negative label,
    # no answer -> wrong too (a false positive), as in the paper
    rows = [*ORIGINAL, result(5, False, None, ok=False, p=0.2)]
    summary = summarise_mode("original", MORTALITY, rows)
    expected = f1([True, False, True, False, False], [True, False, False, True, True])
    assert summary.f1.value == pytest.approx(expected)
    assert summary.f1.low <= expected <= summary.f1.high
    assert summary.n_positive == 2 and summary.n_subjects == 5


def test_multilabel_unparsed_answer_is_wrong_on_every_label() -> None:
    first = PHENOTYPING.labels[0]
    rows = [result(1, [first], None, ok=False), result(2, [first], [first])]
    figures = quality(PHENOTYPING, rows, resample_weights(rows, 50))
    # label 0: tp 1, fn 1 -> 2/3; the other 24 labels: one false positive each -> 0
    assert figures["f1"]["value"] == pytest.approx((2 / 3) / len(PHENOTYPING.labels))
    assert "auroc" not in figures


def test_mode_agreement_matches_records_by_key() -> None:
    # records 1, 2 equal; 3 both unparsed (same: no answer); 4 differs; the original answered
    # 1, 2, 4 and MedTPE agrees on 1 and 2
    shuffled = [MEDTPE[2], MEDTPE[0], MEDTPE[3], MEDTPE[1]]
    assert mode_agreement(ORIGINAL, shuffled) == {
        "agreement": pytest.approx(0.75),
        "agreement_answered": pytest.approx(2 / 3),
    }
    with pytest.raises(ValueError, match="same"):
        mode_agreement(ORIGINAL, MEDTPE[:3])


def test_paired_differences_are_medtpe_minus_original() -> None:
    weights = resample_weights(ORIGINAL, 200)
    deltas = paired_differences(MORTALITY, ORIGINAL, MEDTPE, weights)
    # AUROC: original 0.875; MedTPE 0.8, 0.6, 0.7 and 0.5 (no p) -> positives 0.8, 0.7 beat
    # both negatives 0.6 and 0.5 -> 1.0
    assert deltas["delta_auroc"]["value"] == pytest.approx(0.125)
    assert {"delta_f1", "delta_auprc"} <= set(deltas)
    same = paired_differences(MORTALITY, ORIGINAL, ORIGINAL, weights)
    assert all(d["value"] == d["low"] == d["high"] == 0 for d in same.values())


def test_report_json_shape() -> None:
    report = build_report(
        MORTALITY, {"original": ORIGINAL, "medtpe": MEDTPE}, settings={"task": "icu_mortality"}
    )
    decoded = json.loads(json.dumps(report.to_json()))
    required = {"f1", "auroc", "auprc", "brier", "ece", "fcr", "latency_s_mean", "tokens_mean"}
    assert required <= set(decoded["original"])
    assert required | {"compression_rate"} <= set(decoded["medtpe"])
    assert decoded["agreement"] == pytest.approx(0.75)
    assert decoded["agreement_answered"] == pytest.approx(2 / 3)
    assert decoded["latency_reduction"] == pytest.approx(1 - 6.0 / 12.0)
    assert decoded["original"]["auroc"]["value"] == pytest.approx(0.875)
    assert decoded["medtpe"]["auroc"]["value"] == pytest.approx(1.0)
    assert decoded["delta_auroc"]["value"] == pytest.approx(0.125)
    assert decoded["settings"]["bootstrap_resamples"] == 1000
    assert decoded["p_yes_mae"] == pytest.approx(0.4 / 3)
    assert decoded["records"]["medtpe"][0]["probabilities"] == pytest.approx(
        {"yes": 0.8, "no": 0.2}
    )
    assert decoded["records"]["medtpe"][3]["p_yes"] is None
    assert [r["key"] for r in decoded["records"]["medtpe"]] == [r.key for r in MEDTPE]


def test_single_mode_report_has_no_agreement() -> None:
    report = build_report(MORTALITY, {"medtpe": MEDTPE}, settings={})
    assert report.original is None and report.agreement is None and report.fidelity is None
    assert list(report.to_json()) == ["settings", "medtpe", "records"]


def test_table_lists_both_modes_and_the_comparison() -> None:
    report = build_report(MORTALITY, {"original": ORIGINAL, "medtpe": MEDTPE}, settings={})
    table = format_table(report)
    lines = table.splitlines()
    assert lines[0].startswith("Fidelity, MedTPE vs original on 4 records")  # fidelity leads
    header = next(k for k, line in enumerate(lines) if line.startswith("tokenizer"))
    assert lines[header].split()[:2] == ["tokenizer", "FCR"]
    assert header > lines.index("")
    original_row = next(line for line in lines if line.startswith("original"))
    medtpe_row = next(line for line in lines if line.startswith("medtpe"))
    assert "75.0%" in original_row and original_row.rstrip().endswith("-")
    assert medtpe_row.rstrip().endswith("33.3%")
    original_figures = lines[lines.index(original_row) + 1]
    assert "auroc 0.875 [" in original_figures and "(2 positive labels)" in original_figures
    assert "MedTPE - original: f1 " in table and "auroc +0.125 [" in table
    assert "latency reduction 50.0%" in table and "75.0% of records" in table
    assert "66.7% of those the original answered" in table
    assert "p(yes) MedTPE vs original on 3 records: Pearson r 0.993" in table
    assert "mean |Δp| 0.133, max |Δp| 0.200" in table


def test_records_without_p_yes_score_one_half() -> None:
    unscored = [result(1, True, True), result(2, False, False)]
    figures = quality(MORTALITY, unscored, resample_weights(unscored, 50))
    assert figures["auroc"]["value"] == 0.5 and figures["p_yes_n"] == 0
    one_class = [result(i, True, True, p=0.5) for i in range(3)]
    assert quality(MORTALITY, one_class, resample_weights(one_class, 50))["auroc"]["value"] is None


def test_p_yes_shift_between_modes() -> None:
    # records 1-3 scored in both: (0.9, 0.8), (0.4, 0.6), (0.6, 0.7); x*30 - mean: 8, -7, -1;
    # y*30 - mean: 3, -3, 0
    shift = positive_shift(ORIGINAL, MEDTPE)
    assert shift["p_yes_pairs"] == 3
    assert shift["p_yes_correlation"] == pytest.approx(45 / math.sqrt(114 * 18))
    assert shift["p_yes_mae"] == pytest.approx(0.4 / 3)
    assert shift["p_yes_max_abs_diff"] == pytest.approx(0.2)
    constant = [result(i, True, True, p=0.7) for i in (1, 2)]
    moved = [result(1, True, True, p=0.6), result(2, True, True, p=0.9)]
    assert positive_shift(constant, moved)["p_yes_correlation"] is None
    assert positive_shift(constant, moved)["p_yes_mae"] == pytest.approx(0.15)


def test_results_without_p_yes_recorded_still_load_and_report() -> None:
    # a record as written before p(yes) was recorded (medtpe.evaluation.stored_report loads rows
    # like this)
    row = MEDTPE[0].to_json()
    del row["probabilities"], row["p_yes"]
    old = RecordResult(**row)
    assert old.p_yes is None and old.probabilities is None
    rows = [RecordResult(**{**row, "key": record_key(i, "x")}) for i in range(2)]
    report = build_report(MORTALITY, {"original": rows, "medtpe": rows}, settings={})
    assert report.original.p_yes_n == 0 and report.p_yes_pairs == 0
    assert report.p_yes_correlation is None and report.p_yes_mae is None
    table = format_table(report)
    assert "p(yes)" not in table
