"""The report's seismometer export loaded by Epic's seismometer itself (`seismometer.run_startup`
in its own venv, pandas<3): the rows it keeps are the scored predictions with a known outcome,
their outcomes and scores those of the ledger, the cohorts those configured."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from medtpe.monitoring.report import ReportSettings, write_report
from tests.support.monitoring_rows import N, populated_ledger, sqlite_url
from tests.support.seismometer_venv import seismometer_load, seismometer_python


def test_seismometer_loads_the_export(tmp_path: Path) -> None:
    python = seismometer_python()
    ledger, truth = populated_ledger(sqlite_url(tmp_path))
    write_report(ledger.engine, tmp_path / "out", ReportSettings(resamples=10))
    folder = tmp_path / "out" / "seismometer" / "icu_mortality"
    written = pq.read_table(folder / "predictions.parquet").to_pylist()
    assert len(written) == N + 20  # live and silent rows, no shadow
    known = {r["ContextId"]: r for r in written if r["OutcomeStatus"] == "known"}

    loaded = seismometer_load(python, folder)

    assert loaded["seismometer"] == "0.5.0"
    assert loaded["rows"] == len(known)
    assert loaded["context_ids"] == sorted(known)
    assert loaded["entity_keys"] == ["Id", "ContextId"]
    assert loaded["cohorts"] == sorted(["Site", "Silent", "Sex"])
    events = pq.read_table(folder / "events.parquet").to_pylist()
    assert sorted(e["ContextId"] for e in events) == sorted(known)
    values = [e["Value"] for e in events]
    assert loaded["target_counts"] == {"0": values.count(0), "1": values.count(1)}
    live = {e["ContextId"]: e["Value"] for e in events if known[e["ContextId"]]["Silent"] == "live"}
    assert sum(live.values()) == int(truth["label"][truth["known"]].sum())
    assert loaded["score_sum"] == pytest.approx(sum(r["Score"] for r in known.values()))
    assert {"Outcome_Value", "Score", "PredictTime", "Sex", "Site"} <= set(loaded["columns"])
