"""Mining a MEDS dataset shard by shard: the merged counts equal one pass over all records, the
artefact is the same for 1 and 2 worker processes, and a badly sharded dataset is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from medtpe.cli.main import cli
from medtpe.core.meds.readers import MedsDataset, MedsFormatError
from medtpe.core.prompt import render_record
from medtpe.core.tokenizer import BaseTokenizer, MedTPETokenizer
from medtpe.core.tokenizer.corpus import CorpusSpec, iter_meds_corpus_texts
from medtpe.core.tokenizer.mining import NgramCounter
from medtpe.core.tokenizer.sharded_mining import MiningJob, count_meds_corpus
from tests.support.meds_fixtures import (
    PREDICTION_TIME,
    corpus_tokenizer_file,
    subject_rows,
    write_sharded_data,
    write_table,
)

SHARDS = ((1, 2), (3, 4), (5,), (6, 7))


def _write_labels(root: Path, subjects: list[int]) -> None:
    labels = pa.table(
        {
            "subject_id": pa.array(subjects, pa.int64()),
            "prediction_time": pa.array([PREDICTION_TIME] * len(subjects), pa.timestamp("us")),
        }
    )
    (root / "labels").mkdir(parents=True, exist_ok=True)
    pq.write_table(labels, root / "labels" / "windows.parquet")


@pytest.fixture(scope="module")
def meds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four data shards (one subject in one shard each), labels for every subject."""
    root = write_sharded_data(tmp_path_factory.mktemp("sharded-meds"), SHARDS, lambda s: 20 + 3 * s)
    _write_labels(root, [s for shard in SHARDS for s in shard])
    return root


@pytest.fixture(scope="module")
def tokenizer_file(meds_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus_tokenizer_file(meds_dir, tmp_path_factory.mktemp("base"))


def test_merged_shard_counts_equal_one_pass(meds_dir: Path, tokenizer_file: Path) -> None:
    base = BaseTokenizer.load(tokenizer_file)
    counts, sample = count_meds_corpus(
        MiningJob(CorpusSpec(meds_dir), tokenizer_file, max_n=3), workers=1, progress=False
    )
    one_pass = NgramCounter(base.vocab_size, 3)
    records = base.encode_batch(list(iter_meds_corpus_texts(meds_dir)))
    one_pass.add(records)
    expected = one_pass.result()
    assert (
        (counts.n_records, counts.n_tokens)
        == (expected.n_records, expected.n_tokens)
        == (
            7,
            sum(map(len, records)),
        )
    )
    np.testing.assert_array_equal(counts.unigrams, expected.unigrams)
    for n in (2, 3):
        for got, want in zip(counts.ngrams[n], expected.ngrams[n], strict=True):
            np.testing.assert_array_equal(got, want)
    assert sample == records  # small corpus: every record is in the compression sample


def test_subject_filter_and_label_times(meds_dir: Path, tokenizer_file: Path) -> None:
    spec = CorpusSpec(meds_dir, subjects=frozenset({2, 5}))
    counts, sample = count_meds_corpus(
        MiningJob(spec, tokenizer_file, max_n=2), workers=1, progress=False
    )
    assert counts.n_records == 2
    dataset = MedsDataset.load(meds_dir)
    text = render_record(dataset.events(5), dataset.descriptions, PREDICTION_TIME).text
    assert BaseTokenizer.load(tokenizer_file).encode(text) == sample[1]


def test_artefact_identical_for_one_and_two_workers(
    meds_dir: Path, tokenizer_file: Path, tmp_path: Path
) -> None:
    outs = {}
    for workers in (1, 2):
        out = tmp_path / f"workers-{workers}"
        result = CliRunner().invoke(
            cli,
            [
                "build-tokenizer",
                "--base",
                str(tokenizer_file),
                "--corpus",
                str(meds_dir),
                "--budget",
                "40",
                "--max-n",
                "3",
                "--workers",
                str(workers),
                "--out",
                str(out),
            ],
        )
        assert result.exit_code == 0, result.output
        outs[workers] = out
    one, two = (MedTPETokenizer.load(outs[w]) for w in (1, 2))
    assert len(one.new_tokens) == 40
    assert one.artefact_id == two.artefact_id
    assert (outs[1] / "tokenizer.json").read_bytes() == (outs[2] / "tokenizer.json").read_bytes()
    docs = [json.loads((outs[w] / "medtpe.json").read_text()) for w in (1, 2)]
    for doc in docs:
        doc["corpus_stats"].pop("build_seconds")
    assert docs[0] == docs[1]
    assert docs[0]["corpus_stats"]["n_records"] == 7


def test_subject_in_two_shards_is_refused(tmp_path: Path, tokenizer_file: Path) -> None:
    rows = subject_rows(1, hours=4)
    write_table(tmp_path / "data" / "a.parquet", rows[:10])
    write_table(tmp_path / "data" / "b.parquet", rows[10:])
    job = MiningJob(CorpusSpec(tmp_path), tokenizer_file, max_n=2)
    with pytest.raises(MedsFormatError, match="subject 1 is in more than one data shard"):
        count_meds_corpus(job, progress=False)


def test_label_subject_missing_from_every_shard(tmp_path: Path, tokenizer_file: Path) -> None:
    write_table(tmp_path / "data" / "a.parquet", subject_rows(1, hours=4))
    _write_labels(tmp_path, [1, 9])
    job = MiningJob(CorpusSpec(tmp_path), tokenizer_file, max_n=2)
    with pytest.raises(MedsFormatError, match="subject 9 is not in"):
        count_meds_corpus(job, progress=False)


def test_workers_refused_for_a_jsonl_corpus(tmp_path: Path, tokenizer_file: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "Heart Rate: 80 bpm"}) + "\n")
    args = ["build-tokenizer", "--base", str(tokenizer_file), "--corpus", str(corpus)]
    result = CliRunner().invoke(cli, [*args, "--workers", "2", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--workers applies to a MEDS dataset" in result.output
