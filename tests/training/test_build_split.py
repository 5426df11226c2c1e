"""`medtpe build-artefact`'s split step through `medtpe.core.meds.subject_split`: a dataset's
`metadata/subject_splits.parquet` decides who is trained on (`train`) and who validates and
gates (the others); without one, `held_out` of the subjects with the build's seed. The windows
it samples are prediction points with a task and a budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from medtpe.core.meds import PredictionPoint
from medtpe.core.meds.subject_split import HELD_OUT, TRAIN, TUNING, seeded_split
from medtpe.training.build_artefact import WINDOWS_FILE, ArtefactBuild
from medtpe.training.build_config import build_config
from tests.support.meds_fixtures import write_meds_dataset, write_subject_splits
from tests.support.model_fixtures import tiny_llama

SUBJECTS = tuple(range(1, 11))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def split_step(base: Path, meds: Path, out: Path) -> tuple[dict, list[PredictionPoint]]:
    settings = {"base": base, "meds": meds, "out": out, "tasks": ("icu_mortality",)}
    sizes = {"n_train": 4, "n_val": 2, "n_gate": 2, "max_input_tokens": 700}
    build = ArtefactBuild(build_config(None, settings | sizes | {"serving_budgets": (700,)}))
    result = build.split()
    saved = json.loads((build.work / WINDOWS_FILE).read_text())
    return result, [PredictionPoint.from_json(w) for w in saved["train"] + saved["val"]]


def test_the_datasets_splits_file_decides(base_dir: Path, tmp_path: Path) -> None:
    declared = {s: TRAIN if s <= 6 else TUNING if s <= 8 else HELD_OUT for s in SUBJECTS}
    meds = write_subject_splits(write_meds_dataset(tmp_path / "meds", SUBJECTS, hours=6), declared)
    result, windows = split_step(base_dir, meds, tmp_path / "out")
    assert result["split_source"] == "metadata/subject_splits.parquet"
    assert result["train_subjects"] == [1, 2, 3, 4, 5, 6]
    assert result["held_out_subjects"] == [7, 8, 9, 10]
    assert all(w.task == "icu_mortality" and w.budget is not None for w in windows)


def test_without_one_the_seeded_fraction(base_dir: Path, tmp_path: Path) -> None:
    meds = write_meds_dataset(tmp_path / "meds", SUBJECTS, hours=6)
    result, _ = split_step(base_dir, meds, tmp_path / "out")
    assert result["held_out_subjects"] == seeded_split(SUBJECTS, 0.2, 1).subjects(HELD_OUT)
    assert result["split_source"].startswith("seeded")
