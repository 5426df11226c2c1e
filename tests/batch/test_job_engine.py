"""`medtpe predict --ray` on the real vLLM engine (default model, test artefact, small budget), on
a local Ray cluster started for it: every shard's files, the orphan label's NO_EVENTS row and
the real model's answers; then `medtpe verify` re-derives one of the Ray run's ledger rows on an
engine of its own in this machine's process, part for part (p("yes") within 1e-4): the local
path against the Ray path on the real engine, for that row. Local against Ray row for row, file
for file, is tests/batch/test_job_tasks.py's, on the instant engine. Neither command leaves a
Python traceback on its way out (each shuts its engine down before the interpreter exits)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from meds_evaluation.schema import PredictionSchema

from medtpe.batch.job import NO_EVENTS
from medtpe.cli.command_line import medtpe_command
from tests.support.meds_fixtures import PREDICTION_TIME, write_meds_dataset
from tests.support.service_support import service_env

# one local Ray cluster at a time (the Ray mining tests share the group)
pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.xdist_group("ray")]

P_TOLERANCE = 1e-4
"""Largest |Δp("yes")| between the Ray run's answer and verify's local re-run: float32 rounding.
An engine given another number of cores sums in another order (seen: 0.9258389085 against
0.9258389107), and a prompt served from the prefix cache is prefilled in other pieces than one
prefilled whole (the records' prompts are alike; which one reaches the Ray engine first depends
on the shards' order: seen 0.9395162 against 0.9394939)."""


def test_ray_predict_answers_what_verify_rederives_locally(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    meds = write_meds_dataset(tmp_path / "meds", subjects=(1, 2, 3), hours=30)
    labels = meds / "labels" / "icu_mortality.parquet"
    orphan = pa.table(
        {
            "subject_id": pa.array([99], pa.int64()),
            "prediction_time": pa.array([PREDICTION_TIME], pa.timestamp("us")),
            "boolean_value": pa.array([False]),
        }
    )
    pq.write_table(pa.concat_tables([pq.read_table(labels), orphan]), labels)

    out = tmp_path / "ray"
    artefact, export = service_files
    env = {**os.environ, **service_env(service_files), "MEDTPE_TASK": "icu_mortality"}
    command = medtpe_command(
        "predict",
        "--ray",
        meds=meds,
        labels=labels,
        out=out,
        ray_cpus=2,
        max_input_tokens=512,
        max_new_tokens=16,
        kv_cache_gib=1,
        enforce_eager=True,
        # one record in the engine at a time, as verify's re-run: batches of several records
        # give p(yes) that differ in the 5th decimal with the batch's make-up
        concurrency=1,
        artefact=artefact,
        export_dir=export,
    )
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "4 records scored in 3 shards" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-4000:]

    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "_no_events.parquet",
        "_no_events.records.pq",
        "summary.json",
        "train/0.parquet",
        "train/0.records.pq",
        "train/1.parquet",
        "train/1.records.pq",
    ]
    for name in ("_no_events", "train/0", "train/1"):
        PredictionSchema.align(pq.read_table(out / f"{name}.parquet"))
    records = pa.concat_tables(pq.read_table(p) for p in sorted(out.rglob("*.records.pq")))
    rows = {r["subject_id"]: r for r in records.to_pylist()}
    assert rows.keys() == {1, 2, 3, 99}
    assert rows[99]["error"] == NO_EVENTS
    for subject in (1, 2, 3):
        # the real model answered through the service's path: a parsed answer or its reason
        row = rows[subject]
        assert row["answer"].startswith('{"answer": "')
        assert (row["error"] is None) == row["format_ok"]
        assert row["medtpe_tokens"] < row["original_tokens"] <= 512
        assert 0.0 <= row["p_yes"] <= 1.0

    verify = medtpe_command(
        "verify",
        rows[2]["prediction_id"],
        meds=meds,
        artefact=artefact,
        export_dir=export,
        p_tolerance=P_TOLERANCE,
    )
    checked = subprocess.run(verify, env=env, capture_output=True, text=True, timeout=900)
    assert checked.returncode == 0, checked.stdout + checked.stderr[-4000:]
    report = [line.split() for line in checked.stdout.splitlines()]
    parts = {words[1]: words[0] for words in report if words and words[0] in ("ok", "DIFF")}
    assert {"signature", "record", "prompt", "answer", "p_yes"} <= set(parts), checked.stdout
    assert set(parts.values()) == {"ok"}, checked.stdout
    assert "Traceback" not in checked.stderr, checked.stderr[-4000:]
