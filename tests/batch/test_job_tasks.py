"""`medtpe predict --task a,b,c` on the instant engine: each record read and rendered once for
every task (one `prepare_all`), the record prefilled once and its tasks asked together on
the record the engine has cached; each task's files in a directory of its own, each answer a ledger
row of its own; a run asking the same tasks again (in any order) asks the same prompts; a run
stopped after a shard, or between two tasks' files of one, goes on without a row twice or a
record lost; on a FHIR export through the command line as on a MEDS dataset."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from medtpe.batch import fhir_job
from medtpe.batch.job import Job, run_local
from medtpe.batch.ledger_rows import run_identity
from medtpe.cli.predict_commands import predict
from medtpe.core.meds import MedsDataset
from medtpe.core.tasks import get_task
from medtpe.inference.engines.instant import InstantEngine
from medtpe.inference.engines.protocol import Completion, EngineConfig, EngineDead, GenerationParams
from medtpe.inference.model import load_model
from medtpe.inference.sampling import Sampling
from medtpe.ledger.settings import LedgerSettings
from medtpe.ledger.store import Ledger
from tests.support.ledger_rows import RFC8037_SEED_B64 as SEED
from tests.support.meds_fixtures import write_meds_dataset
from tests.support.mimic_fhir_fixture import FIXTURE, fixture_export
from tests.support.service_support import TEST_SIGNING_KEY, engine_test_config

NAMES = ("icu_mortality", "readmission_30d", "pancreatic_cancer_1y")
TASKS = tuple(get_task(name) for name in NAMES)
SUBJECTS = (1, 2, 3, 4)


class Engines:
    """An `EngineFactory` of instant engines, each kept; `dies_after`: the engine reports death
    at that many prompts (as a crashed vLLM), as a job stopped mid-run."""

    def __init__(self, dies_after: int | None = None) -> None:
        self.started: list[InstantEngine] = []
        self.dies_after = dies_after

    def __call__(self, config: EngineConfig) -> InstantEngine:
        dies_after = self.dies_after

        class Engine(InstantEngine):
            async def generate(
                self, prompt_ids: Sequence[int], params: GenerationParams
            ) -> list[Completion]:
                if dies_after is not None and len(self.prompts) == dies_after:
                    self.die()
                return await super().generate(prompt_ids, params)

        self.started.append(Engine(config.model_dir, config.max_model_len or 8192))
        return self.started[-1]

    @property
    def prompts(self) -> list[list[int]]:
        """Every prompt the engines were given, in order."""
        return [prompt for engine in self.started for prompt in engine.prompts]


def job(meds: Path, names: Sequence[str] = NAMES) -> Job:
    """Every subject at one minute after their last event, for each of `names`."""
    first, *more = (get_task(name) for name in names)
    sampling = Sampling(max_new_tokens=8)
    return Job(meds, first, times=(None,), sampling=sampling, more_tasks=tuple(more))


def records(out: Path) -> list[dict[str, Any]]:
    """The rows of every records file under `out`, by record."""
    tables = [pq.read_table(p) for p in sorted(out.rglob("*.records.pq"))]
    return sorted(pa.concat_tables(tables).to_pylist(), key=lambda r: r["record"])


def ledger_rows(url: str) -> list[Any]:
    ledger = Ledger.open(url)
    try:
        return list(ledger.rows())
    finally:
        ledger.close()


def files(out: Path) -> list[str]:
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


@pytest.fixture
def meds(tmp_path: Path) -> Path:
    """Two data shards of two subjects each."""
    return write_meds_dataset(tmp_path / "meds", subjects=SUBJECTS, hours=8)


@pytest.fixture
def settings(tmp_path: Path) -> LedgerSettings:
    return LedgerSettings(f"sqlite:///{tmp_path / 'ledger.sqlite3'}", "digest", SEED)


def test_three_tasks_read_each_record_once_into_three_predictions_files(
    service_files: tuple[Path, Path], meds: Path, tmp_path: Path, settings: LedgerSettings
) -> None:
    out = tmp_path / "out"
    config = engine_test_config(service_files, meds, max_new_tokens=8)
    engines = Engines()
    summary = run_local(config, job(meds), out, engines, settings)

    shards = ("train/0", "train/1")
    assert files(out) == sorted(
        ["summary.json"]
        + [
            f"{task}/{shard}{suffix}"
            for task in NAMES
            for shard in shards
            for suffix in (".parquet", ".records.pq")
        ]
    )
    by_task = {name: records(out / name) for name in NAMES}
    for name, rows in by_task.items():
        assert [r["subject_id"] for r in rows] == list(SUBJECTS), name
        assert all(r["error"] is None and r["p_yes"] == pytest.approx(0.75) for r in rows)
        predictions = pa.concat_tables(
            pq.read_table(out / name / f"{shard}.parquet") for shard in shards
        )
        assert predictions.column("subject_id").to_pylist() == list(SUBJECTS)

    # each record's tasks: one rendering, their ids the same up to the end of the record (the
    # subjects' records are alike: each subject's prompts are the same three), the first task
    # asked alone and the others from the engine's cache
    prompts = engines.prompts
    predictor = load_model(config).predictor
    prepared = predictor.prepare_all(TASKS, MedsDataset.load(meds).events(1), None)
    asked = [p.ids(predictor.mode) for p in prepared]
    assert sorted(prompts) == sorted(asked * len(SUBJECTS))
    n_shared = prepared[0].segmentation.n_shared(predictor.mode)
    assert len({tuple(ids[:n_shared]) for ids in asked}) == 1
    block = engines.started[0].prefix_cache.block_tokens
    assert n_shared > block
    # each record's shared part prefilled once, then read by every task's prompt
    prefilled = [ids for engine in engines.started for ids in engine.prefills]
    assert prefilled == [asked[0][:n_shared]] * len(SUBJECTS)
    least_cached = len(prompts) * (n_shared // block) * block
    run = summary["this_run"]
    reuse = run["prefix_cache"]
    assert reuse["answers"] == reuse["reusing"] == len(prompts)
    assert least_cached <= reuse["cached_tokens"] < reuse["prompt_tokens"]
    assert reuse["prompt_tokens"] == sum(map(len, prompts))
    assert run["task"] == ",".join(NAMES) and run["records"] == len(SUBJECTS)
    assert summary["records"] == len(SUBJECTS) * len(NAMES)
    assert {name: figures["records"] for name, figures in summary["tasks"].items()} == {
        name: len(SUBJECTS) for name in NAMES
    }

    # each task's answer is a ledger row of its own, under that task
    ids = {name: [r["prediction_id"] for r in rows] for name, rows in by_task.items()}
    every = [i for task_ids in ids.values() for i in task_ids]
    assert len(set(every)) == len(every) == len(SUBJECTS) * len(NAMES)
    rows = {row.prediction_id: row for row in ledger_rows(settings.ledger_url)}
    assert sorted(rows) == sorted(every)
    for name, task_ids in ids.items():
        assert {rows[i].task for i in task_ids} == {name}


def test_the_same_tasks_asked_again_in_another_order_are_the_same_prompts_and_answers(
    service_files: tuple[Path, Path], meds: Path, tmp_path: Path, settings: LedgerSettings
) -> None:
    config = engine_test_config(service_files, meds, max_new_tokens=8)
    first, again = Engines(), Engines()
    run_local(config, job(meds), tmp_path / "first", first, settings)
    run_local(config, job(meds, NAMES[::-1]), tmp_path / "again", again, settings)
    assert sorted(first.prompts) == sorted(again.prompts)
    for name in NAMES:
        ours, theirs = records(tmp_path / "first" / name), records(tmp_path / "again" / name)
        drop = ("generate_s", "prediction_id")
        assert [{k: v for k, v in r.items() if k not in drop} for r in ours] == [
            {k: v for k, v in r.items() if k not in drop} for r in theirs
        ]
        for shard in ("train/0", "train/1"):
            path = f"{name}/{shard}.parquet"
            assert pq.read_table(tmp_path / "first" / path).equals(
                pq.read_table(tmp_path / "again" / path)
            )

    # the run's identity names its task set, not the order it is asked in; one task's is the
    # task its ids name already
    model = load_model(config)
    sampling = Sampling(max_new_tokens=8)
    out = tmp_path / "first"
    assert run_identity(out, model, sampling, NAMES) == run_identity(
        out, model, sampling, NAMES[::-1]
    )
    assert run_identity(out, model, sampling, NAMES) != run_identity(
        out, model, sampling, NAMES[:2]
    )
    assert run_identity(out, model, sampling, NAMES[:1]) == run_identity(out, model, sampling)


def test_a_run_stopped_after_a_shard_goes_on_without_a_row_twice_or_a_record_lost(
    service_files: tuple[Path, Path], meds: Path, tmp_path: Path, settings: LedgerSettings
) -> None:
    out = tmp_path / "out"
    config = engine_test_config(service_files, meds, max_new_tokens=8)
    per_shard = 2 * len(NAMES)  # two subjects a shard
    with pytest.raises(EngineDead):
        run_local(config, job(meds), out, Engines(dies_after=per_shard), settings)
    assert files(out) == sorted(
        f"{name}/train/0{suffix}" for name in NAMES for suffix in (".parquet", ".records.pq")
    )
    written = {name: (out / name / "train" / "0.parquet").stat().st_mtime_ns for name in NAMES}
    engines = Engines()
    summary = run_local(config, job(meds), out, engines, settings)
    assert len(engines.prompts) == per_shard  # shard 1 only
    assert summary["this_run"]["shards_skipped"] == 1
    for name in NAMES:
        assert (out / name / "train" / "0.parquet").stat().st_mtime_ns == written[name]
        assert [r["subject_id"] for r in records(out / name)] == list(SUBJECTS)

    # stopped between two tasks' files of a shard: the shard is scored again for every task,
    # each answer under the id it had, none recorded twice
    before = {name: records(out / name) for name in NAMES}
    (out / NAMES[1] / "train" / "1.parquet").unlink()
    engines = Engines()
    run_local(config, job(meds), out, engines, settings)
    assert len(engines.prompts) == per_shard
    for name in NAMES:
        after = records(out / name)
        assert [r["prediction_id"] for r in after] == [r["prediction_id"] for r in before[name]]
    ids = [r["prediction_id"] for name in NAMES for r in before[name]]
    assert sorted(row.prediction_id for row in ledger_rows(settings.ledger_url)) == sorted(ids)
    assert not list(out.rglob(".*.tmp"))


def test_the_command_asks_several_tasks_of_a_fhir_export(
    service_files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export = fixture_export(tmp_path / "export")
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    monkeypatch.setenv("MEDTPE_LEDGER_URL", url)
    monkeypatch.setenv("MEDTPE_LEDGER_SIGNING_KEY", TEST_SIGNING_KEY)
    engines = Engines()
    monkeypatch.setitem(fhir_job.run_fhir.__kwdefaults__, "engine_factory", engines)
    artefact, export_dir = service_files
    out = tmp_path / "out"
    arguments = [
        *("--fhir", str(export), "--task", ",".join(NAMES[:2]), "--times", "last"),
        *("--out", str(out), "--artefact", str(artefact), "--export-dir", str(export_dir)),
        *("--max-input-tokens", "1024", "--max-new-tokens", "8"),
    ]
    result = CliRunner().invoke(predict, arguments)
    assert result.exit_code == 0, result.output
    n = len(MedsDataset.load(FIXTURE).subject_ids)
    for name in NAMES[:2]:
        title = get_task(name).title
        assert f"{title}: {n} records scored" in result.output
        assert len(records(out / name)) == n
    assert f"{2 * n}/{2 * n} prefills shared" in result.output  # each reads the prefilled record
    assert len(engines.prompts) == 2 * n
    assert len({row.prediction_id for row in ledger_rows(url)}) == 2 * n


@pytest.mark.parametrize(
    ("task", "extra", "message"),
    [
        ("icu_mortality,no_such_task", [], "unknown task 'no_such_task'; known: "),
        ("icu_mortality,icu_mortality", [], "'icu_mortality' named more than once"),
        ("icu_mortality,readmission_30d", ["--labels", "LABELS"], "a label file labels one task"),
    ],
)
def test_the_command_refuses_a_task_list_it_cannot_ask(
    meds: Path, tmp_path: Path, task: str, extra: list[str], message: str
) -> None:
    labels = str(meds / "labels" / "icu_mortality.parquet")
    argv = ["--meds", str(meds), "--task", task, "--out", str(tmp_path / "out")]
    argv += [labels if a == "LABELS" else a for a in extra] or ["--times", "last"]
    result = CliRunner().invoke(predict, argv)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert message in result.output.splitlines()[-1]
    assert not (tmp_path / "out").exists()


def test_a_job_refuses_a_label_file_for_several_tasks(meds: Path) -> None:
    labels = meds / "labels" / "icu_mortality.parquet"
    with pytest.raises(ValueError, match="a label file labels one task"):
        Job(meds, TASKS[0], labels=labels, more_tasks=TASKS[1:])


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # one local Ray cluster at a time
def test_on_ray_the_tasks_are_the_local_job_file_for_file(
    service_files: tuple[Path, Path], meds: Path, tmp_path: Path, settings: LedgerSettings
) -> None:
    """Local against Ray, row for row and file for file, with several tasks (on the real
    engine, tests/batch/test_job_engine.py checks one task's Ray run and `medtpe verify`
    re-derives one of its rows locally)."""
    from medtpe.batch.ray_job import RayResources, run_ray

    names = NAMES

    config = engine_test_config(service_files, meds, max_new_tokens=8)
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    run_local(config, job(meds, names), local, Engines(), settings)
    summary = run_ray(
        config,
        job(meds, names),
        on_ray,
        RayResources(num_cpus=2),
        ledger=settings,
        engine_factory=InstantEngine.factory(),
    )
    assert files(local) == files(on_ray)
    drop = ["generate_s", "prediction_id"]
    for name in files(local):
        if name.endswith(".records.pq"):
            ours = pq.read_table(local / name).drop_columns(drop)
            assert ours.equals(pq.read_table(on_ray / name).drop_columns(drop)), name
        elif name.endswith(".parquet"):
            assert pq.read_table(local / name).equals(pq.read_table(on_ray / name)), name
    assert files(local) == sorted(
        ["summary.json"]
        + [
            f"{name}/train/{shard}{suffix}"
            for name in names
            for shard in (0, 1)
            for suffix in (".parquet", ".records.pq")
        ]
    )
    reuse = summary["this_run"]["prefix_cache"]
    assert reuse["answers"] == len(SUBJECTS) * len(names) and reuse["cached_tokens"] > 0
    ids = [r["prediction_id"] for r in records(on_ray)]
    assert len(set(ids)) == len(ids) == len(SUBJECTS) * len(names)
