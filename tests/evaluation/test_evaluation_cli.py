"""`medtpe evaluate` end to end: a synthetic MEDS dataset through the real vLLM engine on the
default model, original and MedTPE modes, two records, a small input budget."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from medtpe.cli.command_line import medtpe_command
from tests.support.meds_fixtures import write_meds_dataset
from tests.support.service_support import service_env

pytestmark = [pytest.mark.slow, pytest.mark.engine]


def test_evaluate_both_modes(service_files: tuple[Path, Path], tmp_path: Path) -> None:
    meds = write_meds_dataset(tmp_path / "meds", subjects=(1, 2, 3), hours=30)
    out = tmp_path / "report.json"
    artefact, export = service_files
    command = medtpe_command(
        "evaluate",
        meds=meds,
        labels=meds / "labels" / "icu_mortality.parquet",
        task="icu_mortality",
        mode="both",
        split="all",  # the fixture has no subject_splits.parquet: held_out would be 1 of 3
        limit=2,
        max_input_tokens=512,
        max_new_tokens=16,
        kv_cache_gib=1,
        enforce_eager=True,  # no torch.compile: the engine is ready minutes sooner on CPU
        window_policy="stable",
        window_grid_hours=6,
        artefact=artefact,
        export_dir=export,
        out=out,
    )
    env = {**os.environ, **service_env(service_files)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]

    report = json.loads(out.read_text())
    assert (report["settings"]["window_policy"], report["settings"]["window_grid_hours"]) == (
        "stable",
        6,
    )
    for mode in ("original", "medtpe"):
        summary = report[mode]
        assert summary["n_records"] == 2
        assert 0.0 <= summary["fcr"] <= 1.0 and 0.0 <= summary["f1"]["value"] <= 1.0
        assert summary["latency_s_total"] >= summary["latency_s_mean"] > 0
    original, medtpe = report["records"]["original"], report["records"]["medtpe"]
    assert [r["key"] for r in original] == [r["key"] for r in medtpe]
    # equal information: the same prompt, counted in original tokens, in both modes
    assert [r["original_tokens"] for r in medtpe] == [r["n_tokens"] for r in original]
    assert all(r["original_tokens"] <= 512 for r in original)
    assert report["medtpe"]["tokens_mean"] < report["original"]["tokens_mean"]
    assert report["medtpe"]["compression_rate"] > 0
    assert 0.0 <= report["agreement"] <= 1.0
    assert "original" in done.stdout and "same answer on" in done.stdout
