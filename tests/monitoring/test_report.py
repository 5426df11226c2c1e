"""`medtpe.monitoring.report` on ledger rows made through the ledger's API, outcomes and attributes
stored by `medtpe.ledger.outcomes.record_outcomes`, feedback in the ledger's table: every figure
checked against scikit-learn / numpy on the same rows; silent and shadow rows apart; the page states
what the AUROC says and embeds its plots, no network asset."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.backends.backend_agg import RendererAgg
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, roc_auc_score

from medtpe.core.thresholds import Thresholds, ThresholdsError
from medtpe.ledger.outcomes import OutcomeRow, record_outcomes
from medtpe.ledger.store import Ledger
from medtpe.monitoring.figures import ECE_BINS
from medtpe.monitoring.report import (
    REPORT_HTML,
    REPORT_JSON,
    ReportSettings,
    build_report,
    write_report,
)
from tests.support.monitoring_rows import START, N, populated_ledger, prediction, sqlite_url

THRESHOLDS = Thresholds.parse(
    {"default": 0.5, "tasks": {"icu_mortality": {"default": 0.4, "sites": {"b": 0.6}}}}
)


def _ece(y: np.ndarray, p: np.ndarray) -> float:
    bins = np.minimum((p * ECE_BINS).astype(int), ECE_BINS - 1)
    return sum(abs((y[bins == b] - p[bins == b]).sum()) for b in range(ECE_BINS)) / len(y)


def _expected(truth: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, object]:
    p, y = truth["p"], truth["label"]
    cut = np.where(truth["site"] == "b", 0.6, 0.4)
    flagged = p >= cut
    known = rows & truth["known"]
    logit = np.log(p / (1 - p))[known].reshape(-1, 1)
    fit = LogisticRegression(C=np.inf, tol=1e-10, max_iter=1000).fit(logit, y[known])
    return {
        "n": int(rows.sum()),
        "flag_rate": flagged[rows].mean(),
        "auroc": roc_auc_score(y[known], p[known]),
        "auprc": average_precision_score(y[known], p[known]),
        "ece": _ece(y[known].astype(float), p[known]),
        "slope": fit.coef_[0][0],
        "intercept": fit.intercept_[0],
        "sensitivity": (flagged & y)[known].sum() / y[known].sum(),
        "ppv": (flagged & y)[known].sum() / flagged[known].sum(),
        "latency": np.percentile(truth["latency"][rows], [50, 95]),
    }


def _check(figures: dict, expected: dict) -> None:
    assert figures["n"] == expected["n"]
    assert figures["flag_rate"] == pytest.approx(expected["flag_rate"])
    assert figures["auroc"]["value"] == pytest.approx(expected["auroc"])
    assert figures["auroc"]["low"] < figures["auroc"]["value"] < figures["auroc"]["high"]
    assert figures["auprc"]["value"] == pytest.approx(expected["auprc"])
    assert figures["ece"]["value"] == pytest.approx(expected["ece"])
    assert figures["calibration"]["slope"] == pytest.approx(expected["slope"], rel=1e-4)
    assert figures["calibration"]["intercept"] == pytest.approx(expected["intercept"], abs=1e-4)
    assert figures["sensitivity"] == pytest.approx(expected["sensitivity"])
    assert figures["ppv"] == pytest.approx(expected["ppv"])
    latency = figures["latency_ms"]
    assert [latency["p50"], latency["p95"]] == pytest.approx(list(expected["latency"]))


def test_figures_match_sklearn_overall_by_week_site_and_subgroup(ledger_url: str) -> None:
    ledger, truth = populated_ledger(ledger_url)
    report, _ = build_report(ledger.engine, ReportSettings(thresholds=THRESHOLDS, resamples=100))
    (task,) = report["tasks"]
    everyone = np.ones(N, dtype=bool)
    _check(task["overall"], _expected(truth, everyone))
    assert task["overall"]["outcomes"] == {
        "known": int(truth["known"].sum()),
        "open": N - int(truth["known"].sum()),
        "no_label": 0,
        "not_joined": 0,
        "positives": int(truth["label"][truth["known"]].sum()),
        "negatives": int((~truth["label"][truth["known"]]).sum()),
    }
    assert [w["week"] for w in task["by_week"]] == ["2026-W37", "2026-W38", "2026-W39"]
    for week in task["by_week"]:
        _check(week, _expected(truth, truth["week"] == week["week"]))
    for site in task["by_site"]:
        name = "" if site["site"] == "(none)" else site["site"]
        _check(site, _expected(truth, truth["site"] == name))
    assert task["thresholds"] == {"default": 0.4, "by_site": {"(none)": 0.4, "a": 0.4, "b": 0.6}}
    assert sum(s["n"] for s in task["by_site_week"]) == N
    sexes = {g["value"]: g for g in task["by_subgroup"] if g["attribute"] == "sex"}
    for value, figures in sexes.items():
        _check(figures, _expected(truth, truth["sex"] == value))
    assert task["verdict"].startswith("The model discriminates better than chance")
    assert task["overall"]["overrides"] == {
        "feedback": 40,
        "overridden": 20,
        "override_rate": 0.5,
        "by_reason": {
            "not-relevant": {"n": 10, "share_of_feedback": 0.25},
            "(no reason given)": {"n": 10, "share_of_feedback": 0.25},
        },
    }


def test_threshold_sweep_counts_alerts_per_day(tmp_path: Path) -> None:
    ledger, truth = populated_ledger(sqlite_url(tmp_path))
    since, until = START, START + timedelta(days=20)
    report, _ = build_report(ledger.engine, ReportSettings(since, until, THRESHOLDS, resamples=20))
    sweep = {s["threshold"]: s for s in report["tasks"][0]["threshold_sweep"]}
    p, y, known = truth["p"], truth["label"], truth["known"]
    for threshold in (0.1, 0.5, 0.9):
        flagged = p >= threshold
        assert sweep[threshold]["alerts_per_day"] == pytest.approx(flagged.sum() / 20)
        assert sweep[threshold]["sensitivity"] == pytest.approx(
            (flagged & y)[known].sum() / y[known].sum()
        )
        assert sweep[threshold]["ppv"] == pytest.approx(
            (flagged & y)[known].sum() / flagged[known].sum()
        )


def test_silent_and_shadow_rows_are_reported_apart(tmp_path: Path) -> None:
    ledger, truth = populated_ledger(sqlite_url(tmp_path))
    report, _ = build_report(ledger.engine, ReportSettings(resamples=20))
    (task,) = report["tasks"]
    original = truth["p"][[k * 7 for k in range(10)]]
    shadowed = np.clip(original + [0.3 if k % 2 else 0.01 for k in range(10)], 0, 1)
    assert task["overall"]["n"] == N  # neither silent nor shadow rows among the live ones
    assert task["silent"]["overall"]["n"] == 20
    shadow = task["shadow"]
    assert (shadow["rows"], shadow["n"], shadow["unpaired"]) == (10, 10, 0)
    assert shadow["mean_abs_dp"] == pytest.approx(np.abs(shadowed - original).mean())
    assert shadow["agreement"] == pytest.approx(np.mean((shadowed >= 0.5) == (original >= 0.5)))
    assert sum(w["n"] for w in shadow["by_week"]) == 10
    # a period holding only a shadow row still pairs it with the row it shadows
    first_shadow = START + timedelta(seconds=1)
    alone = ReportSettings(first_shadow, first_shadow + timedelta(seconds=1), resamples=20)
    only, _ = build_report(ledger.engine, alone)
    assert only["predictions"] == 1 and only["tasks"][0]["overall"]["n"] == 0
    assert only["tasks"][0]["shadow"]["n"] == 1


def test_a_model_that_does_not_discriminate_is_told_so(tmp_path: Path) -> None:
    ledger, _ = populated_ledger(sqlite_url(tmp_path), informative=False)
    out = tmp_path / "report"
    report = write_report(ledger.engine, out, ReportSettings(resamples=100))
    auroc = report["tasks"][0]["overall"]["auroc"]
    assert auroc["low"] <= 0.5 <= auroc["high"]
    verdict = report["tasks"][0]["verdict"]
    assert verdict.startswith("The model does not discriminate")
    page = (out / REPORT_HTML).read_text()
    assert verdict in page.replace("&#x27;", "'")
    assert page.count('src="data:image/png;base64,') >= 6
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert json.loads((out / REPORT_JSON).read_text()) == report


def test_site_names_are_escaped_in_the_page(tmp_path: Path) -> None:
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    ledger.record(
        [
            prediction(
                i,
                created_at=START,
                subject_id=str(i),
                prediction_time=None,
                p_yes=0.4,
                site="<script>x</script>",
            )
            for i in range(3)
        ]
    )
    write_report(ledger.engine, tmp_path / "out", ReportSettings(resamples=10))
    page = (tmp_path / "out" / REPORT_HTML).read_text()
    assert "<script" not in page and "&lt;script&gt;" in page
    assert "Discrimination cannot be measured" in page


MATHS_LIKE = ("$\\x$", "$$", "_^{}", "$\\alpha$")
"""Names matplotlib would read as maths: an unknown command, an empty formula, sub- and superscript
marks, a Greek letter."""


def test_cohort_names_are_drawn_as_written_never_as_maths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger.open(sqlite_url(tmp_path))
    rows = [
        prediction(
            i,
            created_at=START + timedelta(hours=i),
            subject_id=str(i),
            prediction_time=None,
            p_yes=0.2 + 0.6 * (i % 2),
            site=MATHS_LIKE[i % 4],
        )
        for i in range(32)
    ]
    ledger.record(rows)
    outcomes = [
        OutcomeRow(row.prediction_id, "known", bool(i // 4 % 2), None, {"unit": MATHS_LIKE[i % 4]})
        for i, row in enumerate(rows)
    ]
    record_outcomes(ledger, outcomes, source="test", data_end=None, joined_at=START)
    drawn: list[tuple[str, object]] = []
    draw_text = RendererAgg.draw_text

    def recorded(self: RendererAgg, *args: Any, ismath: object = False, **kwargs: Any) -> None:
        drawn.append((args[3], ismath))  # (gc, x, y, s, prop, angle)
        draw_text(self, *args, ismath=ismath, **kwargs)

    monkeypatch.setattr(RendererAgg, "draw_text", recorded)
    write_report(ledger.engine, tmp_path / "out", ReportSettings(resamples=10))
    page = (tmp_path / "out" / REPORT_HTML).read_text()
    for name in MATHS_LIKE:
        assert (f"unit={name} (n=8)", False) in drawn  # the subgroup plot's tick label
        assert f"<td>unit={name}</td>" in page and f"<td>{name}</td>" in page
    assert not [text for text, ismath in drawn if ismath]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"default": 1.5}, "between 0 and 1"),
        ({"default": True}, "between 0 and 1"),
        ({"sites": {}}, "expected the keys"),
        ({"tasks": {"icu_mortality": {"site": {"a": 0.2}}}}, "expected the keys"),
        ({"tasks": {"icu_mortality": {"sites": {"a": "high"}}}}, r"tasks.icu_mortality.sites.a"),
    ],
)
def test_threshold_files_are_checked(data: object, message: str) -> None:
    with pytest.raises(ThresholdsError, match=message):
        Thresholds.parse(data)


def test_thresholds_by_task_and_site() -> None:
    assert THRESHOLDS.of("icu_mortality", "b") == 0.6
    assert THRESHOLDS.of("icu_mortality", "a") == THRESHOLDS.of("icu_mortality") == 0.4
    assert THRESHOLDS.of("readmission_30d", "b") == 0.5
