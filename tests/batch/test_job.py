"""`medtpe predict`'s local job (`medtpe.batch.job.run_local`) on the project's synthetic MEDS
dataset: the real model files, prompts and tokenizers, an engine that answers at once (the engine
is not the point here; tests/batch/test_job_engine.py runs the real one)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from meds_evaluation.schema import PredictionSchema

from medtpe.batch.fhir_job import FhirShardPlan
from medtpe.batch.job import (
    NO_EVENTS,
    UNPARSED,
    Job,
    Request,
    ShardPlan,
    limited,
    plan_shards,
    run_local,
)
from medtpe.batch.rows import read_records
from medtpe.cli.predict_commands import predict
from medtpe.core.figure_names import RENAMED
from medtpe.core.tasks import get_task
from medtpe.inference.engines.instant import InstantEngine
from medtpe.inference.engines.protocol import Completion, EngineConfig, GenerationParams
from medtpe.inference.sampling import Sampling
from tests.support.meds_fixtures import PREDICTION_TIME, write_meds_dataset
from tests.support.service_support import engine_test_config, own_ledger_environment

SUBJECTS = (1, 2, 3, 4)

own_ledger = pytest.fixture(scope="module", autouse=True)(own_ledger_environment)
"""The module's batch runs record to a ledger of their own, signed with the test key."""


class FailingEngine(InstantEngine):
    """Answers at once, but raises for the `fail_at`-th prompt (0-based) and writes an
    unparsable answer for the `garble_at`-th."""

    def __init__(self, config: EngineConfig, fail_at: int, garble_at: int) -> None:
        super().__init__(config.model_dir, config.max_model_len or 8192)
        self.fail_at, self.garble_at = fail_at, garble_at

    async def generate(
        self, prompt_ids: Sequence[int], params: GenerationParams
    ) -> list[Completion]:
        index = len(self.prompts)
        outputs = await super().generate(prompt_ids, params)
        if index == self.fail_at:
            raise ValueError("prompt rejected")
        if index == self.garble_at:
            return [Completion([], None)]
        return outputs


@pytest.fixture
def meds(tmp_path: Path) -> Path:
    """Two data shards of two subjects each, a label file with a row for subject 99 that has no
    events."""
    root = write_meds_dataset(tmp_path / "meds", subjects=SUBJECTS, hours=8)
    labels = pq.read_table(root / "labels" / "icu_mortality.parquet")
    extra = pa.table(
        {
            "subject_id": pa.array([99], pa.int64()),
            "prediction_time": pa.array([PREDICTION_TIME], pa.timestamp("us")),
            "boolean_value": pa.array([True]),
        }
    )
    pq.write_table(pa.concat_tables([labels, extra]), root / "labels" / "icu_mortality.parquet")
    return root


def _job(meds: Path, **changes: object) -> Job:
    settings = {
        "meds_dir": meds,
        "task": get_task("icu_mortality"),
        "labels": meds / "labels" / "icu_mortality.parquet",
        "sampling": Sampling(max_new_tokens=8),
        "concurrency": 2,
    }
    return Job(**{**settings, **changes})


def test_failures_are_written_with_their_reason(
    service_files: tuple[Path, Path], meds: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    engines: list[FailingEngine] = []

    def factory(config: EngineConfig) -> FailingEngine:
        engines.append(FailingEngine(config, fail_at=1, garble_at=2))
        return engines[-1]

    config = engine_test_config(service_files, meds, max_new_tokens=8)
    summary = run_local(config, _job(meds), out, engine_factory=factory)

    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.parquet")) == [
        "_no_events.parquet",
        "train/0.parquet",
        "train/1.parquet",
    ]
    records = pa.concat_tables(pq.read_table(p) for p in sorted(out.rglob("*.records.pq")))
    by_subject = {r["subject_id"]: r for r in records.to_pylist()}
    assert sorted(by_subject) == [1, 2, 3, 4, 99]
    # record 1 (subject 2) was refused by the engine, record 2 (subject 3) answered garbage
    assert by_subject[2]["error"] == "generate: ValueError: prompt rejected"
    assert by_subject[3]["error"] == UNPARSED and by_subject[3]["answer"] == '{"answer": "'
    assert by_subject[99]["error"] == NO_EVENTS and by_subject[99]["original_tokens"] is None
    for subject in (1, 4):
        row = by_subject[subject]
        assert row["error"] is None and row["answer"] == '{"answer": "yes"}'
        assert json.loads(row["prediction"]) is True and row["p_yes"] == pytest.approx(0.75)
        assert row["medtpe_tokens"] < row["original_tokens"] <= 512
    assert len(engines[0].prompts) == 4  # subject 99 never reached the engine

    # every row is in the predictions, in meds-evaluation's schema; a failure is a miss
    predictions = pa.concat_tables(pq.read_table(p) for p in sorted(out.rglob("*.parquet")))
    PredictionSchema.align(predictions)
    # float64: what MEDS-DEV's pinned meds-evaluation (0.0.3) accepts (0.0.6 casts it)
    assert predictions.schema.field("predicted_boolean_probability").type == pa.float64()
    rows = {r["subject_id"]: r for r in predictions.to_pylist()}
    for subject in (2, 3, 99):
        assert rows[subject]["predicted_boolean_value"] is (not rows[subject]["boolean_value"])
        assert rows[subject]["predicted_boolean_probability"] == 0.5
    assert rows[1]["predicted_boolean_value"] is True

    assert summary["records"] == 5 and summary["failures"] == 3
    assert summary["failure_kinds"] == {
        "generate: ValueError": 1,
        UNPARSED: 1,
        NO_EVENTS: 1,
    }
    assert summary["original_tokens"] == sum(r["original_tokens"] or 0 for r in by_subject.values())
    assert summary["medtpe_tokens"] == sum(r["medtpe_tokens"] or 0 for r in by_subject.values())
    assert 0 < summary["compression_rate"] < 1
    run = summary["this_run"]
    assert (run["records"], run["shards_written"], run["shards_skipped"]) == (5, 3, 0)
    assert run["records_per_s"] > 0 and run["max_input_tokens"] == 512
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary))


def test_second_run_skips_written_shards(
    service_files: tuple[Path, Path], meds: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    config = engine_test_config(service_files, meds, max_new_tokens=8)
    engines: list[InstantEngine] = []

    def factory(config: EngineConfig) -> InstantEngine:
        engines.append(InstantEngine(config.model_dir, config.max_model_len or 8192))
        return engines[-1]

    run_local(config, _job(meds), out, engine_factory=factory)
    kept = out / "train" / "0.parquet"
    kept_stamp = kept.stat().st_mtime_ns
    (out / "train" / "1.parquet").unlink()  # as if the job had died while writing shard 1

    summary = run_local(config, _job(meds), out, engine_factory=factory)
    assert [len(e.prompts) for e in engines] == [4, 2]  # only shard 1's subjects again
    assert kept.stat().st_mtime_ns == kept_stamp
    run = summary["this_run"]
    assert (run["shards_written"], run["shards_skipped"], run["records"]) == (1, 2, 2)
    assert summary["records"] == 5  # the summary covers every shard in --out
    assert not list(out.rglob(".*.tmp"))

    summary = run_local(config, _job(meds), out, engine_factory=factory)
    assert len(engines) == 2  # nothing left: no engine started
    assert summary["this_run"]["records"] == 0 and summary["records"] == 5


def test_a_records_file_an_earlier_release_wrote_still_counts(
    service_files: tuple[Path, Path], meds: Path, tmp_path: Path
) -> None:
    # records files written before the columns took the ledger's names (`p_positive`,
    # `n_tokens_original`, `n_tokens_medtpe`): a resumed run skips their shards and its summary
    # counts them; read back, their columns have the current names
    out = tmp_path / "out"
    config = engine_test_config(service_files, meds, max_new_tokens=8)

    def factory(config: EngineConfig) -> InstantEngine:
        return InstantEngine(config.model_dir, config.max_model_len or 8192)

    first = run_local(config, _job(meds), out, engine_factory=factory)
    path = out / "train" / "0.records.pq"
    current = pq.read_table(path)
    earlier = {new: old for old, new in RENAMED.items()}
    written = current.rename_columns([earlier.get(n, n) for n in current.column_names])
    assert {"p_positive", "n_tokens_original", "n_tokens_medtpe"} <= set(written.column_names)
    pq.write_table(written, path)
    (out / "train" / "1.parquet").unlink()

    again = run_local(config, _job(meds), out, engine_factory=factory)
    assert again["this_run"]["shards_skipped"] == 2 and again["this_run"]["records"] == 2
    assert (again["records"], again["original_tokens"], again["medtpe_tokens"]) == (
        first["records"],
        first["original_tokens"],
        first["medtpe_tokens"],
    )
    assert read_records(path).equals(current)
    assert read_records(path, ["medtpe_tokens", "p_yes"]).equals(
        current.select(["medtpe_tokens", "p_yes"])
    )


def test_times_without_labels(service_files: tuple[Path, Path], meds: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = engine_test_config(service_files, meds, max_new_tokens=8)
    job = _job(meds, labels=None, times=(None, PREDICTION_TIME))
    engine = {}

    def factory(config: EngineConfig) -> FailingEngine:
        engine["it"] = FailingEngine(config, fail_at=0, garble_at=-1)
        return engine["it"]

    summary = run_local(config, job, out, engine_factory=factory)
    predictions = pa.concat_tables(pq.read_table(p) for p in sorted(out.rglob("*.parquet")))
    assert "boolean_value" not in predictions.column_names
    assert predictions.num_rows == summary["records"] == 2 * len(SUBJECTS)
    # each subject at its last event + 1 minute, and at the given time
    times = predictions.column("prediction_time").to_pylist()
    assert times.count(PREDICTION_TIME) == len(SUBJECTS)
    # the failed record has no predicted value (no label to count it wrong against)
    assert predictions.column("predicted_boolean_value").to_pylist().count(None) == 1
    assert summary["failures"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "either --labels FILE or --times"),
        (["--times", "last", "--labels", "LABELS"], "either --labels FILE or --times"),
        (["--times", "yesterday"], "'yesterday' is neither 'last' nor an ISO date-time"),
        (["--times", "last", "--partition", "2/2"], "'2/2' is not I/N with 0 <= I < N"),
    ],
)
def test_cli_rejects_bad_record_selection(
    meds: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    labels = str(meds / "labels" / "icu_mortality.parquet")
    argv = ["--meds", str(meds), "--task", "icu_mortality", "--out", str(tmp_path / "out")]
    argv += [labels if a == "LABELS" else a for a in args]
    result = CliRunner().invoke(predict, argv)
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "out").exists()


def test_partitions_share_one_out(
    service_files: tuple[Path, Path], meds: Path, tmp_path: Path
) -> None:
    config = engine_test_config(service_files, meds, max_new_tokens=8)

    def factory(config: EngineConfig) -> InstantEngine:
        return InstantEngine(config.model_dir, config.max_model_len or 8192)

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    run_local(config, _job(meds), whole, engine_factory=factory)
    first = run_local(config, _job(meds, partition=(0, 2)), parts, engine_factory=factory)
    assert first["this_run"]["shards_written"] == 2  # train/0 and the subject without events
    second = run_local(config, _job(meds, partition=(1, 2)), parts, engine_factory=factory)
    assert second["this_run"]["shards_written"] == 1 and second["records"] == 5
    names = sorted(p.relative_to(whole) for p in whole.rglob("*.parquet"))
    assert names == sorted(p.relative_to(parts) for p in parts.rglob("*.parquet"))
    for name in names:
        assert pq.read_table(whole / name).equals(pq.read_table(parts / name))


def test_limit_keeps_the_first_records_of_every_kind_of_plan(meds: Path) -> None:
    plans = plan_shards(_job(meds, limit=3))
    assert [[r.subject_id for r in p.requests] for p in plans] == [[1, 2], [3], []]
    assert all(type(p) is ShardPlan for p in plans)
    # a FHIR bucket's plan keeps each kept record's patient beside it
    requests = tuple(Request(k, 10 + k, None) for k in (4, 0, 2))
    bucket = FhirShardPlan("bucket-00000", None, requests, patients=("d", "a", "c"), bucket=0)
    other = FhirShardPlan("bucket-00001", None, (Request(1, 11, None),), ("b",), bucket=1)
    kept = limited([bucket, other], 2)
    assert [(p.requests, p.patients, p.bucket) for p in kept] == [
        ((Request(0, 10, None),), ("a",), 0),
        ((Request(1, 11, None),), ("b",), 1),
    ]
    assert limited([bucket], None) == [bucket]
