"""Mining on Ray Data (`--ray`): the same count tables, compression sample and artefact as the
in-process and worker-process paths, on a local Ray cluster the tests start (2 CPUs, no
dashboard); `build-artefact --ray` mines the same tokenizer, and resumes without Ray."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="needs the `ray` extra (pip install 'medtpe[ray]')")

from click.testing import CliRunner  # noqa: E402

from medtpe.cli.main import cli  # noqa: E402
from medtpe.core.tokenizer import MedTPETokenizer  # noqa: E402
from medtpe.core.tokenizer.corpus import CorpusSpec  # noqa: E402
from medtpe.core.tokenizer.mining import NgramCounts  # noqa: E402
from medtpe.core.tokenizer.sharded_mining import MiningJob, count_meds_corpus  # noqa: E402
from tests.support.meds_fixtures import corpus_tokenizer_file, write_sharded_data  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one local Ray cluster at a time

SHARDS = ((1, 2), (3, 4), (5,), (6, 7), (8, 9, 10))


@pytest.fixture(scope="module")
def meds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five data shards of different sizes (so Ray tasks finish out of shard order)."""
    return write_sharded_data(tmp_path_factory.mktemp("ray-meds"), SHARDS, lambda s: 20 + 7 * s)


@pytest.fixture(scope="module")
def tokenizer_file(meds_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus_tokenizer_file(meds_dir, tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for the tests that take it (a start is seconds to tens of seconds
    on a loaded machine); `--ray` reuses the session the process has. The tests that check
    that `--ray` starts and stops a cluster of its own come before the first that takes it."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _assert_same_counts(got: NgramCounts, want: NgramCounts) -> None:
    assert (got.n_records, got.n_tokens) == (want.n_records, want.n_tokens)
    np.testing.assert_array_equal(got.unigrams, want.unigrams)
    assert got.ngrams.keys() == want.ngrams.keys()
    for n, (keys, counts) in want.ngrams.items():
        np.testing.assert_array_equal(got.ngrams[n][0], keys)
        np.testing.assert_array_equal(got.ngrams[n][1], counts)


def _build_tokenizer(base: Path, corpus: Path, out: Path, *options: str) -> MedTPETokenizer:
    args = ["--base", str(base), "--corpus", str(corpus), "--budget", "40", "--max-n", "3"]
    result = CliRunner().invoke(cli, ["build-tokenizer", *args, *options, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return MedTPETokenizer.load(out)


def test_build_tokenizer_ray_starts_a_local_cluster_and_writes_the_same_artefact(
    meds_dir: Path, tokenizer_file: Path, tmp_path: Path
) -> None:
    assert not ray.is_initialized()
    outs = {
        "in-process": tmp_path / "one",
        "workers": tmp_path / "two",
        "ray": tmp_path / "ray",
    }
    one = _build_tokenizer(tokenizer_file, meds_dir, outs["in-process"])
    two = _build_tokenizer(tokenizer_file, meds_dir, outs["workers"], "--workers", "2")
    on_ray = _build_tokenizer(tokenizer_file, meds_dir, outs["ray"], "--ray")
    assert not ray.is_initialized()  # the cluster `--ray` started is shut down
    assert len(one.new_tokens) == 40
    assert one.artefact_id == two.artefact_id == on_ray.artefact_id
    files = {name: (out / "tokenizer.json").read_bytes() for name, out in outs.items()}
    assert files["ray"] == files["in-process"] == files["workers"]
    docs = {name: json.loads((out / "medtpe.json").read_text()) for name, out in outs.items()}
    for doc in docs.values():
        doc["corpus_stats"].pop("build_seconds")
    assert docs["ray"] == docs["in-process"] == docs["workers"]


def test_ray_option_errors_are_named(meds_dir: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    args = ["build-tokenizer", "--base", str(tokenizer_file), "--out", str(tmp_path / "o")]
    both = CliRunner().invoke(cli, [*args, "--corpus", str(meds_dir), "--workers", "2", "--ray"])
    assert both.exit_code == 2 and "--workers and --ray exclude each other" in both.output
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "Heart Rate: 80 bpm"}) + "\n")
    jsonl = CliRunner().invoke(cli, [*args, "--corpus", str(corpus), "--ray"])
    assert jsonl.exit_code == 2 and "--ray applies to a MEDS dataset" in jsonl.output
    nowhere = CliRunner().invoke(cli, [*args, "--corpus", str(meds_dir), "--ray", "127.0.0.1:1"])
    assert nowhere.exit_code == 2 and "--ray 127.0.0.1:1: cannot connect to Ray" in nowhere.output
    assert not ray.is_initialized()


def test_ray_count_tables_equal_in_process_and_worker_processes(
    meds_dir: Path, tokenizer_file: Path, ray_cluster: None
) -> None:
    job = MiningJob(CorpusSpec(meds_dir), tokenizer_file, max_n=3, sample_tokens=2_000)
    in_process, sample = count_meds_corpus(job, workers=1, progress=False)
    workers, workers_sample = count_meds_corpus(job, workers=2, progress=False)
    on_ray, ray_sample = count_meds_corpus(job, progress=False, ray_address="local")
    assert in_process.n_records == 10 and in_process.n_tokens > 2_000 > 0
    _assert_same_counts(workers, in_process)
    _assert_same_counts(on_ray, in_process)
    assert ray_sample == workers_sample == sample  # the first records in shard order
    assert sum(map(len, sample)) < in_process.n_tokens  # a sample, not every record
    assert ray.is_initialized()  # the test's session was reused, not shut down


def test_re_counted_longer_merges_are_the_same_on_ray(
    meds_dir: Path, tokenizer_file: Path, tmp_path: Path, ray_cluster: None
) -> None:
    """The default artefact's selection (re-counted merges of runs longer than pairs) on Ray
    gives the in-process tokenizer (on the module's cluster: starting one is the test above)."""
    longer = ("--method", "bpe", "--max-n", "6")
    pairs = _build_tokenizer(tokenizer_file, meds_dir, tmp_path / "pairs")
    bpe = _build_tokenizer(tokenizer_file, meds_dir, tmp_path / "bpe", *longer)
    bpe_ray = _build_tokenizer(tokenizer_file, meds_dir, tmp_path / "bpe-ray", *longer, "--ray")
    assert bpe.artefact_id == bpe_ray.artefact_id != pairs.artefact_id
    assert (tmp_path / "bpe" / "tokenizer.json").read_bytes() == (
        tmp_path / "bpe-ray" / "tokenizer.json"
    ).read_bytes()
    assert max(len(t.constituents) for t in bpe.new_tokens) > 3


class Interrupted(Exception):
    """Stops a build after its mine step (the steps after it do not depend on the backend)."""


def test_build_artefact_ray_mines_the_same_tokenizer_and_resumes_without_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ray_cluster: None
) -> None:
    pytest.importorskip("torch")
    from medtpe.training.build_artefact import ArtefactBuild
    from tests.support.meds_fixtures import write_meds_dataset
    from tests.support.model_fixtures import tiny_llama
    from tests.training.test_build_artefact import SETTINGS  # the tiny build's settings

    def interrupted(self: ArtefactBuild) -> dict:
        raise Interrupted

    monkeypatch.setattr(ArtefactBuild, "pseudo_label", interrupted)
    base = tiny_llama(tmp_path / "tiny-llama")
    meds = write_meds_dataset(tmp_path / "meds", subjects=tuple(range(1, 11)))
    config = tmp_path / "build.yaml"
    config.write_text(SETTINGS)

    def build(out: Path, *options: str) -> dict:
        args = ["--config", str(config), "--base", str(base), "--meds", str(meds)]
        with pytest.raises(Interrupted):
            CliRunner().invoke(
                cli,
                ["build-artefact", *args, "--out", str(out), *options],
                catch_exceptions=False,
            )
        return json.loads((out / ".build" / "state.json").read_text())["steps"]

    workers = build(tmp_path / "workers", "--workers", "2")
    on_ray = build(tmp_path / "ray", "--ray")
    assert ray.is_initialized()  # the module's cluster was used, not shut down
    assert list(on_ray) == ["check", "split", "render", "mine"]
    assert on_ray["mine"]["result"] == workers["mine"]["result"]
    assert on_ray["mine"]["result"]["n_records"] > 0
    # `ray_address` is a runtime setting: the Ray build resumes without Ray, mining not redone
    resumed = build(tmp_path / "ray")
    assert resumed["mine"] == on_ray["mine"]
