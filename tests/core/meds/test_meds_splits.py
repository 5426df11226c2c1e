"""MEDS metadata the evaluation honours: `metadata/subject_splits.parquet` (evaluate on held_out,
render a tuning corpus) and `meds_version` in `metadata/dataset.json`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import meds
import pytest
from click.testing import CliRunner

from medtpe.cli.meds_commands import render
from medtpe.core.meds.prediction_point import read_points
from medtpe.core.meds.readers import MedsDataset, read_subject_splits
from medtpe.core.prompt import render_record
from medtpe.core.tasks import get_task
from medtpe.evaluation.records import load_records
from tests.support.meds_fixtures import train_tokenizer, write_meds_dataset, write_subject_splits
from tests.support.paths import FIXTURES

SMOLLM2_DIR = FIXTURES / "smollm2"
SPLITS = {1: meds.train_split, 2: meds.tuning_split, 3: meds.held_out_split}


@pytest.fixture
def meds_dir(tmp_path: Path) -> Path:
    root = write_subject_splits(
        write_meds_dataset(tmp_path / "meds", subjects=(1, 2, 3), hours=6), SPLITS
    )
    info = {"dataset_name": "synthetic", "meds_version": "0.4.1"}
    (root / meds.dataset_metadata_filepath).write_text(json.dumps(info))
    return root


def test_splits_and_version_are_read(meds_dir: Path, tmp_path: Path) -> None:
    assert read_subject_splits(meds_dir) == SPLITS
    assert MedsDataset.load(meds_dir).meds_version == "0.4.1"
    plain = write_meds_dataset(tmp_path / "plain", subjects=(1,), hours=2)
    assert read_subject_splits(plain) == {}
    assert MedsDataset.load(plain).meds_version is None


def test_evaluation_records_of_one_split(meds_dir: Path) -> None:
    labels = meds_dir / "labels" / "icu_mortality.parquet"
    task = get_task("icu_mortality")
    held_out = load_records(meds_dir, labels, task, split=meds.held_out_split)
    assert [r.events.subject_id for r in held_out] == [3]
    assert len(load_records(meds_dir, labels, task)) == 3  # no split: every row


def test_render_a_tuning_corpus(meds_dir: Path, tmp_path: Path) -> None:
    dataset = MedsDataset.load(meds_dir)
    tokenizer = train_tokenizer([render_record(s, dataset.descriptions).text for s in dataset])
    model = tmp_path / "model"
    shutil.copytree(SMOLLM2_DIR, model)
    tokenizer.tokenizer.save(str(model / "tokenizer.json"))
    out = tmp_path / "tuning.jsonl"
    args = ["--meds", meds_dir, "--labels", meds_dir / "labels" / "icu_mortality.parquet"]
    args += ["--task", "icu_mortality", "--base", model, "--split", "tuning", "--out", out]
    result = CliRunner().invoke(render, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["subject_id"] for row in rows] == [2]
    # each line is a prediction point (label as the task reads it) with its prompt
    assert [(p.subject_id, p.label, p.task) for p in read_points(out)] == [
        (2, True, "icu_mortality")
    ]
