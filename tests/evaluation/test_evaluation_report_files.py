"""The typed evaluation report (`medtpe.evaluation.report_schema.EvaluationReport`): a built report
survives `to_json` / `from_json` unchanged with the fidelity block first, and every report file
in `tools/benchmarks/results/` and `tools/research/results/` loads, including those written before
the bootstrap intervals and those with keys renamed since, and is written back with the same keys
(the top level in the same order, renamed keys under their current names) and the same figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from medtpe.core.figure_names import RENAMED, current_names
from medtpe.core.metrics import Interval
from medtpe.evaluation.figures import build_report, format_table
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.report_schema import EvaluationReport, ModeSummary
from tests.evaluation.test_evaluation_report import MEDTPE, MORTALITY, ORIGINAL
from tests.support.paths import ROOT

RESULTS = ROOT / "tools" / "benchmarks" / "results"
REPORT_FILES = sorted((ROOT / "tools" / "research" / "results").glob("fidelity_*.json")) + [
    path
    for path in sorted(RESULTS.glob("eval_*.json"))
    if path.name not in ("eval_grid_v2.json", "eval_tasks.json")  # reports nested inside
]


def nested_reports() -> list[tuple[str, dict[str, Any]]]:
    """The reports inside the settings-sweep files: eval_tasks.json (task, setting) and
    eval_grid_v2.json (mode, grid point)."""
    tasks = json.loads((RESULTS / "eval_tasks.json").read_text())["tasks"]
    grid = json.loads((RESULTS / "eval_grid_v2.json").read_text())["modes"]
    return [
        (f"eval_tasks {task} {setting}", report)
        for task, by_setting in tasks.items()
        for setting, report in by_setting.items()
    ] + [
        (f"eval_grid_v2 {mode} {point}", report)
        for mode, by_point in grid.items()
        for point, report in by_point.items()
    ]


def current(stored: dict[str, Any]) -> dict[str, Any]:
    """`stored` with the keys renamed since under their current names (the top level, each
    mode's figures and each record row: `medtpe.core.figure_names.RENAMED`)."""
    data = current_names(stored)
    for mode in ("original", "medtpe"):
        if mode in data:
            data[mode] = current_names(data[mode])
    data["records"] = {m: [current_names(r) for r in rows] for m, rows in data["records"].items()}
    return data


def assert_written_back(written: dict[str, Any]) -> EvaluationReport:
    """`written` loads; written back it has the same keys (the top level in the same order, keys
    renamed since under their current names and only those) and the same figures; each record row
    comes back with the fields it had (and any newer field at its default)."""
    report = EvaluationReport.from_json(written)
    again = report.to_json()
    assert not set(RENAMED) & {*again, *again.get("medtpe", {}), *again.get("original", {})}
    assert all(not set(RENAMED) & set(row) for rows in again["records"].values() for row in rows)
    stored = current(written)
    assert list(again) == list(stored)
    for key in stored:
        if key != "records":  # as text: NaN (meds-evaluation's undefined scores) compares
            assert json.dumps(again[key], sort_keys=True) == json.dumps(stored[key], sort_keys=True)
    for mode, rows in stored["records"].items():
        assert len(again["records"][mode]) == len(rows)
        for old, new in zip(rows, again["records"][mode], strict=True):
            assert {k: new[k] for k in old} == old
    assert EvaluationReport.from_json(again) == report
    return report


def test_built_report_round_trips(tmp_path: Path) -> None:
    report = build_report(MORTALITY, {"original": ORIGINAL, "medtpe": MEDTPE}, settings={})
    data = report.to_json()
    assert list(data)[:4] == ["settings", "fidelity", "original", "medtpe"]
    assert list(data)[-1] == "records"
    assert EvaluationReport.from_json(json.loads(json.dumps(data))) == report
    report.write(tmp_path / "out" / "report.json")
    assert EvaluationReport.read(tmp_path / "out" / "report.json") == report
    assert isinstance(report.fidelity.same_answer, Interval)
    assert report.mode("medtpe") is report.medtpe and report.mode("original") is report.original


def test_a_mistyped_figure_is_refused() -> None:
    figures = build_report(MORTALITY, {"medtpe": MEDTPE}, settings={}).medtpe.model_dump()
    with pytest.raises(ValueError, match="fcr"):
        ModeSummary.model_validate(figures | {"fcr": "high"})
    with pytest.raises(ValueError, match="f1_score"):
        ModeSummary.model_validate(figures | {"f1_score": 0.5})  # a key no report has


@pytest.mark.parametrize("path", REPORT_FILES, ids=lambda p: p.name)
def test_stored_report_files_load(path: Path) -> None:
    report = assert_written_back(json.loads(path.read_text()))
    assert format_table(report)  # what `medtpe evaluate` prints, from a stored report too
    if path.name.startswith("fidelity_"):
        assert report.fidelity is not None and report.fidelity.n_records == 22


def test_reports_inside_the_sweep_files_load() -> None:
    reports = nested_reports()
    assert len(reports) > 20
    for name, stored in reports:
        try:
            assert_written_back(stored)
        except (AssertionError, ValueError) as exc:
            raise AssertionError(f"{name}: {exc}") from exc


def test_reports_before_the_intervals_keep_their_plain_figures() -> None:
    report = EvaluationReport.read(RESULTS / "eval_table2_v2.json")
    assert isinstance(report.original.f1, float) and report.original.f1_std is not None
    assert report.fidelity is None and report.delta_f1 is None
    table = format_table(report)
    assert f"f1 {report.original.f1:.3f}," in table


def test_build_reports_gate_records_load_under_current_names() -> None:
    # the fidelity gate's records in a build report (`tools.research.bench_fidelity` reads them
    # back), written with `n_tokens_original` and `p_positive`
    paths = sorted((ROOT / "tools" / "research" / "results").glob("build_report_*.json"))
    assert paths
    for path in paths:
        for budget, gate in json.loads(path.read_text())["gate"].items():
            for record in gate["records"]:
                for mode, written in record.items():
                    assert {"n_tokens_original", "p_positive"} <= set(written), (path, budget)
                    again = RecordResult.from_json(written).to_json()
                    assert again == current_names(written), (path.name, budget, mode)
                    assert again["original_tokens"] == written["n_tokens_original"]
                    assert again["p_yes"] == written["p_positive"]
