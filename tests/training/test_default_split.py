"""The default artefact's split is reproducible: its build settings
(`artefacts/smollm2-135m-icu/build.yaml`) over the shared demo data's ICU windows give exactly
the held-out patients its `build_report.json` names, through `medtpe.core.meds.subject_split`."""

from __future__ import annotations

import json

import pytest

from medtpe.core.meds.subject_split import subject_split
from medtpe.training.build_config import build_config
from medtpe.training.build_data import prediction_times
from tests.support.paths import ROOT, SHARED

ARTEFACT = ROOT / "artefacts" / "smollm2-135m-icu"
DEMO = SHARED / "data" / "mimic-iv-demo-meds"


@pytest.mark.skipif(not DEMO.is_dir(), reason=f"the shared MEDS data ({DEMO}) is not here")
def test_default_artefacts_held_out_subjects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # build.yaml's paths are relative to the repository root
    config = build_config(ARTEFACT / "build.yaml", {"base": ROOT / "unused-base"})
    subjects = [s for s, _ in prediction_times(config)]
    split = subject_split(config.meds, subjects, config.held_out, config.seed)
    _, held_out = split.train_and_held_out(subjects)
    report = json.loads((ARTEFACT / "build_report.json").read_text())
    assert held_out == report["held_out_subjects"]
    assert len(held_out) == 13 and split.source.startswith("seeded")
