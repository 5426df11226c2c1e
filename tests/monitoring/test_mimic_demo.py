"""End to end on the shared MIMIC-IV demo (skipped without it): `medtpe predict`'s batch job
scores the demo's ICU-mortality label rows on the instant engine (the real model files, prompts
and tokenizers; an engine that answers at once with one fixed p) into the ledger (the batch door
writes a signed row per answer, as `medtpe predict` does), outcomes are joined from the demo by
the task's labeller, the report is built and seismometer loads its export. A model that gives
every patient the same p cannot discriminate: the report must say so."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from medtpe.batch.job import Job, run_local
from medtpe.cli.monitor_commands import monitor, outcomes
from medtpe.core.tasks import get_task
from medtpe.inference.engines.instant import InstantEngine
from medtpe.inference.engines.protocol import EngineConfig
from medtpe.inference.sampling import Sampling
from medtpe.ledger.schema import Outcome, Prediction
from medtpe.ledger.settings import LedgerSettings
from medtpe.ledger.store import Ledger
from medtpe.monitoring.frame import naive_utc as naive
from tests.support.monitor_commands import invoke
from tests.support.paths import SHARED
from tests.support.seismometer_venv import seismometer_load, seismometer_python
from tests.support.service_support import TEST_SIGNING_KEY, engine_test_config

DEMO = SHARED / "data" / "mimic-iv-demo-meds"
LABELS = DEMO / "labels" / "icu_mortality.parquet"
pytestmark = pytest.mark.skipif(not LABELS.is_file(), reason=f"{DEMO} is not here")
RECORDS = 30
"""Label rows scored (the first of each shard's plan; the demo has 93)."""


def _scored(service_files: tuple[Path, Path], out: Path, ledger_url: str) -> list[dict]:
    config = engine_test_config(service_files, DEMO, max_new_tokens=8)
    job = Job(
        meds_dir=DEMO,
        task=get_task("icu_mortality"),
        labels=LABELS,
        sampling=Sampling(max_new_tokens=8),
        limit=RECORDS,
    )

    def instant(engine: EngineConfig) -> InstantEngine:
        return InstantEngine(engine.model_dir, engine.max_model_len or 8192)

    ledger = LedgerSettings(ledger_url, "digest", TEST_SIGNING_KEY, False)
    run_local(config, job, out, engine_factory=instant, ledger=ledger)
    tables = [pq.read_table(p) for p in sorted(out.rglob("*.records.pq"))]
    return [r for r in pa.concat_tables(tables).to_pylist() if r["error"] is None]


def test_demo_predictions_outcomes_report(service_files: tuple[Path, Path], tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    scored = _scored(service_files, tmp_path / "predict", url)
    assert len(scored) >= 20
    ledger = Ledger.open(url)
    rows = list(ledger.rows(task="icu_mortality"))
    ledger.close()
    assert sorted(r.prediction_id for r in rows) == sorted(r["prediction_id"] for r in scored)
    assert {r.door for r in rows} == {"batch_meds"}
    shared_labels = {
        (r["subject_id"], r["prediction_time"]): r["boolean_value"]
        for r in pq.read_table(LABELS).to_pylist()
    }

    code, joined = invoke(outcomes, "--ledger", url, "--task", "icu_mortality", "--meds", str(DEMO))

    assert code == 0, joined
    counts = json.loads(joined.strip().splitlines()[-1])
    assert set(counts["statuses"]) <= {"known", "no_label"}
    assert counts["statuses"]["known"] >= 20
    ledger = Ledger.open(url)
    with ledger.engine.connect() as connection:
        stored = connection.execute(
            select(Prediction.subject_id, Prediction.prediction_time, Outcome.label)
            .join(Outcome)
            .where(Outcome.status == "known")
        ).all()
    ledger.close()
    # the task's labeller agrees with the shared label file on every row it labels (the file
    # also holds stays the labeller leaves out: those are `no_label`)
    expected = [shared_labels[int(s), naive(t)] for s, t, _ in stored]
    assert [label for _, _, label in stored] == expected
    assert counts["positives"] == sum(expected)
    out = tmp_path / "report"
    code, printed = invoke(monitor, "--ledger", url, "--out", str(out), "--resamples", "50")
    assert code == 0, printed
    assert "The model does not discriminate" in printed
    (task,) = json.loads((out / "report.json").read_text())["tasks"]
    assert task["overall"]["outcomes"]["positives"] == sum(expected)
    assert task["overall"]["outcomes"]["no_label"] == counts["statuses"].get("no_label", 0)
    assert {g["attribute"] for g in task["by_subgroup"]} == {"sex", "age_band"}
    assert len(task["by_week"]) >= 1  # one night's run: one week
    loaded = seismometer_load(seismometer_python(), out / "seismometer" / "icu_mortality")
    assert loaded["rows"] == len(stored)
    assert loaded["target_counts"].get("1", 0) == sum(expected)
