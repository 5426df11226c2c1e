"""Stored `medtpe evaluate` reports read back: each mode's results, two runs compared record by
record (`medtpe compare-runs`), and a report re-scored with meds-evaluation's scores beside it
(`medtpe rescore`)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from medtpe.cli.main import cli
from medtpe.core.tasks import get_task
from medtpe.evaluation.figures import build_report
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.records import load_records
from medtpe.evaluation.stored_report import compare_runs, mode_results, stored_results
from tests.support.meds_fixtures import write_meds_dataset

MORTALITY = get_task("icu_mortality")


def result(key: str, label: bool, prediction: bool | None, p: float | None) -> RecordResult:
    return RecordResult(
        key=key,
        label=label,
        prediction=prediction,
        format_ok=prediction is not None,
        latency_s=1.0,
        generate_s=0.5,
        n_tokens=90,
        original_tokens=100,
        p_yes=p,
    )


def write_report(path: Path, results: dict[str, list[RecordResult]], **settings: str) -> Path:
    report = build_report(MORTALITY, results, settings={"task": "icu_mortality", **settings})
    report.write(path)
    return path


ORIGINAL = [result("1@t", False, False, 0.2), result("2@t", True, True, 0.9)]
MEDTPE = [result("1@t", False, True, 0.6), result("2@t", True, True, 0.8)]


def test_stored_results_load_as_written(tmp_path: Path) -> None:
    path = write_report(tmp_path / "r.json", {"original": ORIGINAL, "medtpe": MEDTPE})
    assert stored_results(json.loads(path.read_text())) == {"original": ORIGINAL, "medtpe": MEDTPE}
    assert mode_results(f"{path}:medtpe") == MEDTPE
    with pytest.raises(ValueError, match="'medtpe', 'original'"):
        mode_results(f"{path}:other")


def test_compare_runs_matches_records_by_key() -> None:
    figures = compare_runs(ORIGINAL, MEDTPE[::-1])
    assert figures["agreement"] == pytest.approx(0.5)
    assert figures["p_yes_pairs"] == 2
    assert figures["p_yes_mae"] == pytest.approx(0.25)
    assert figures["p_yes_max_abs_diff"] == pytest.approx(0.4)


def test_compare_runs_command(tmp_path: Path) -> None:
    path = write_report(tmp_path / "r.json", {"original": ORIGINAL, "medtpe": MEDTPE})
    out = CliRunner().invoke(cli, ["compare-runs", f"{path}:original", f"{path}:medtpe"])
    assert out.exit_code == 0, out.output
    figures = json.loads(out.output)
    assert figures["first"] == f"{path}:original" and figures["agreement"] == pytest.approx(0.5)
    missing = CliRunner().invoke(cli, ["compare-runs", f"{path}:original", f"{path}:nope"])
    assert missing.exit_code == 1 and "'nope'" in missing.output


def test_rescore_rebuilds_the_report_and_scores_it_with_meds_evaluation(tmp_path: Path) -> None:
    meds = write_meds_dataset(tmp_path / "meds", subjects=(1, 2, 3, 4))
    labels = meds / "labels" / "icu_mortality.parquet"
    records = load_records(meds, labels, MORTALITY)
    scores = (0.3, 0.8, 0.4, 0.6)
    rows = [result(r.key, r.label, p > 0.5, p) for r, p in zip(records, scores, strict=True)]
    report = write_report(tmp_path / "r.json", {"medtpe": rows}, meds=str(meds), labels=str(labels))
    out_path = tmp_path / "rescored.json"
    command = ["rescore", str(report), "--predictions-dir", str(tmp_path / "pred")]
    done = CliRunner().invoke(cli, [*command, "--out", str(out_path)])
    assert done.exit_code == 0, done.output
    rescored = json.loads(out_path.read_text())
    assert rescored["settings"]["rescored_from"] == str(report)
    assert rescored["records"]["medtpe"] == json.loads(report.read_text())["records"]["medtpe"]
    table = pq.read_table(tmp_path / "pred" / "medtpe.parquet")
    assert table["predicted_boolean_probability"].to_pylist() == list(scores)
    meds_evaluation = rescored["meds_evaluation"]["medtpe"]["samples_equally_weighted"]
    assert meds_evaluation["roc_auc_score"] == pytest.approx(1.0)
