"""The MEDS corpus iterator (for build-tokenizer) and `medtpe render`."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner

from medtpe.cli.meds_commands import render
from medtpe.core.meds import MedsDataset
from medtpe.core.prompt import render_record
from medtpe.core.tokenizer.corpus import iter_meds_corpus_texts
from tests.support.meds_fixtures import train_tokenizer, write_meds_dataset
from tests.support.paths import FIXTURES

SMOLLM2_DIR = FIXTURES / "smollm2"


@pytest.fixture
def meds_dir(tmp_path):
    return write_meds_dataset(tmp_path / "meds")


@pytest.fixture
def model_dir(tmp_path, meds_dir):
    """A model-like dir: a base tokenizer.json and SmolLM2's chat template."""
    dataset = MedsDataset.load(meds_dir)
    tokenizer = train_tokenizer([render_record(s, dataset.descriptions).text for s in dataset])
    model = tmp_path / "model"
    shutil.copytree(SMOLLM2_DIR, model)
    tokenizer.tokenizer.save(str(model / "tokenizer.json"))
    return model


def test_corpus_from_label_times(meds_dir):
    texts = list(iter_meds_corpus_texts(meds_dir))
    assert len(texts) == 3  # one per label row
    assert all("Heart Rate: 93 bpm" in t and "Heart Rate: 94 bpm" not in t for t in texts)


def test_corpus_budgeted(meds_dir, model_dir):
    from medtpe.core.tokenizer import BaseTokenizer

    tokenizer = BaseTokenizer.load(model_dir)
    texts = list(iter_meds_corpus_texts(meds_dir, tokenizer, max_tokens=200))
    assert all(len(tokenizer.encode(t)) <= 200 for t in texts)


def test_corpus_whole_histories_in_chunks(meds_dir):
    shutil.rmtree(meds_dir / "labels")
    whole = list(iter_meds_corpus_texts(meds_dir, chunk_events=10_000))
    assert len(whole) == 3 and "Heart Rate: 99 bpm" in whole[0]  # past the label time too
    chunks = list(iter_meds_corpus_texts(meds_dir, chunk_events=20))
    assert len(chunks) > 6
    # each chunk dates its first group
    assert all(re.match(r"\[(static\]|\d{4}-\d\d-\d\d )", c) for c in chunks)
    assert sum(c.count(" bpm") for c in chunks) == sum(w.count(" bpm") for w in whole)


def test_render_command(meds_dir, model_dir, tmp_path):
    out = tmp_path / "out" / "icu.jsonl"
    args = [
        "--meds",
        meds_dir,
        "--labels",
        meds_dir / "labels" / "icu_mortality.parquet",
        "--task",
        "icu_mortality",
    ]
    args += ["--base", model_dir, "--max-input-tokens", "700", "--out", out]
    result = CliRunner().invoke(render, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["subject_id"], r["label"]) for r in rows] == [(1, False), (2, True), (3, False)]
    for row in rows:
        assert row["prediction_time"] == "2150-03-02T08:00:00"
        assert row["text"] in row["prompt"] and row["prompt"].startswith("<|im_start|>system")
        assert 600 < row["n_tokens_original"] <= 700


def test_render_command_unknown_task(meds_dir, model_dir, tmp_path):
    args = [
        "--meds",
        meds_dir,
        "--labels",
        meds_dir / "labels",
        "--task",
        "nope",
        "--base",
        model_dir,
    ]
    result = CliRunner().invoke(render, [str(a) for a in [*args, "--out", tmp_path / "o.jsonl"]])
    assert result.exit_code == 2 and "unknown task 'nope'" in result.output
