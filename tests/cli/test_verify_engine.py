"""`medtpe verify` on the real vLLM engine, once: a row `medtpe predict` recorded (real engine,
default model, test artefact) re-derives to the same prediction (exit status 0), and neither
command leaves a Python traceback on its way out (each shuts its engine down before the
interpreter exits)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from medtpe.cli.command_line import medtpe_command
from tests.support.meds_fixtures import write_meds_dataset
from tests.support.service_support import service_env

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(1800)]

SUBJECT = 2


def test_verify_re_derives_a_recorded_row_on_the_real_engine_without_a_traceback(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    artefact, export = service_files
    meds = write_meds_dataset(tmp_path / "meds", subjects=(SUBJECT,))
    out = tmp_path / "predictions"
    env = {**os.environ, **service_env(service_files), "MEDTPE_TASK": "icu_mortality"}
    files = {"artefact": artefact, "export_dir": export}
    predict = medtpe_command(
        "predict",
        meds=meds,
        labels=meds / "labels" / "icu_mortality.parquet",
        out=out,
        max_input_tokens=512,
        max_new_tokens=16,
        kv_cache_gib=1,
        enforce_eager=True,
        **files,
    )
    done = subprocess.run(predict, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    (recorded,) = pq.read_table(out / "train" / "0.records.pq").column("prediction_id").to_pylist()

    verify = medtpe_command("verify", recorded, meds=meds, **files)
    checked = subprocess.run(verify, env=env, capture_output=True, text=True, timeout=900)
    assert checked.returncode == 0, checked.stdout + checked.stderr[-4000:]
    report = [line.split() for line in checked.stdout.splitlines()]
    parts = {words[1]: words[0] for words in report if words and words[0] in ("ok", "DIFF")}
    assert {"signature", "record", "prompt", "answer", "p_yes"} <= set(parts), checked.stdout
    assert set(parts.values()) == {"ok"}, checked.stdout
    assert "Traceback" not in checked.stderr, checked.stderr[-4000:]
