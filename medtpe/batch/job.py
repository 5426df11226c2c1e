"""`medtpe predict`: every record of a MEDS dataset through the service's inference path, shard by
shard, into meds-evaluation prediction files (the production batch job).

A record is one (subject, prediction time): a label file's row, or each subject of the dataset at
each of the given times. Per MEDS data shard `data/<name>.parquet` the job writes

- `<out>/<name>.parquet`: meds-evaluation's predictions (`subject_id`, `prediction_time`,
  `predicted_boolean_value`, `predicted_boolean_probability`, and `boolean_value` when the labels
  carry it), as `medtpe.batch.rows.predictions_table` writes them; exactly those columns, since
  meds-evaluation rejects any other;
- `<out>/<name>.records.pq`: one row per record (`medtpe.batch.rows.RecordRow`; a suffix that
  MEDS-DEV's `**/*.parquet` glob skips): its position, answer text, token counts under both
  tokenizers and, for a record that could not be scored, the reason (`error`).

A record that cannot be scored (no events, a prompt that fails, a generation error, an answer
that does not parse) is written with its reason and never stops the job: with labels it gets the
evaluation's convention (the wrong value, probability `UNSCORED_PROBABILITY`, so meds-evaluation
scores it as a miss); without labels its predicted value is null. A dead engine does stop it.

Memory is bounded by one shard (its events and results) and the engine, not by the dataset: a
shard is read, scored and written before the next is read. Files are written to a temporary name
and renamed, the predictions file last, so a shard whose predictions file exists is complete and
a second run skips it (resume). The label file itself is read whole (a few numbers per record).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Self, TypeVar

import meds
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from medtpe.batch.ledger_rows import RunLedger, RunRecorder, run_identity
from medtpe.batch.rows import RecordRow, predictions_table, read_records, records_table
from medtpe.core.meds.readers import MedsDataset, data_shards, read_labels
from medtpe.core.meds.subject_split import subject_split
from medtpe.core.metrics import compression_rate
from medtpe.core.tasks import Prediction, Task
from medtpe.core.tasks.option_probabilities import positive_probability
from medtpe.inference.engines.factories import start_vllm
from medtpe.inference.engines.protocol import Engine, EngineDead, EngineFactory
from medtpe.inference.model import LoadedModel, ModelConfig, load_model
from medtpe.inference.predictor import Predictor, PreparedRecord
from medtpe.inference.record import MedsRecord
from medtpe.inference.sampling import Sampling
from medtpe.ledger.settings import LedgerSettings

RECORDS_SUFFIX = ".records.pq"
SUMMARY_FILE = "summary.json"
NO_EVENTS = "no events: the subject is in no data shard"
UNPARSED = "answer not parsed"


@dataclass(frozen=True)
class Request:
    """One record to score: a label row (`record` = its row in the label file) or a subject at
    a requested time (`record` = its position in the job)."""

    record: int
    subject_id: int
    prediction_time: datetime | None
    """None: one minute after the subject's last event (the service's default)."""
    label: Prediction | None = None


@dataclass(frozen=True)
class ShardPlan:
    """The records of one data shard (`path` None: label rows whose subject has no events)."""

    name: str
    """The shard's path under `data/` without `.parquet` (e.g. `train/0`): its output name."""
    path: Path | None
    requests: tuple[Request, ...]

    def up_to(self, last: int) -> Self:
        """This plan with only its records at positions up to `last`."""
        return replace(self, requests=tuple(r for r in self.requests if r.record <= last))


@dataclass(frozen=True)
class Job:
    """What to score and how (generation settings as the service's defaults)."""

    meds_dir: Path | None
    """The MEDS dataset whose shards are scored; None when the records come from elsewhere (a
    FHIR export, `medtpe.batch.fhir_job`)."""
    task: Task
    labels: Path | None = None
    times: tuple[datetime | None, ...] = (None,)
    """Without labels: score every subject at each of these times."""
    split: str | None = None
    """Only the subjects of this split (`medtpe.core.meds.subject_split`; None: all)."""
    partition: tuple[int, int] | None = None
    """(i, n): only the data shards whose position is i modulo n, so n independent jobs (a Slurm
    array, joblib) share the shards of one `--out`; label rows without events go with i = 0."""
    limit: int | None = None
    sampling: Sampling = field(default_factory=Sampling)
    """How each answer is decoded, as `medtpe evaluate`'s (the answer options' probabilities
    asked for: `p_yes`)."""
    concurrency: int = 16
    """Records in flight to one engine at a time."""


def failed(request: Request, reason: str, prepared: PreparedRecord | None = None) -> RecordRow:
    """The row of a record that could not be scored, with its reason."""
    seg = prepared.segmentation if prepared is not None else None
    return RecordRow(
        record=request.record,
        subject_id=request.subject_id,
        prediction_time=prepared.prediction_time if prepared else request.prediction_time,
        label=request.label,
        prediction=None,
        format_ok=False,
        p_yes=None,
        answer=None,
        error=reason,
        original_tokens=len(seg.original_ids) if seg else None,
        medtpe_tokens=len(seg.medtpe_ids) if seg else None,
        generate_s=0.0,
    )


def _reason(stage: str, exc: Exception) -> str:
    return f"{stage}: {type(exc).__name__}: {exc}"


# --- planning -------------------------------------------------------------------------------


def shard_name(meds_dir: Path, shard: Path) -> str:
    """A data shard's output name: its path under `data/`, without `.parquet`."""
    relative = shard.relative_to(Path(meds_dir) / meds.data_subdirectory)
    return relative.with_suffix("").as_posix()


def _shard_subjects(shard: Path) -> list[int]:
    subjects = pq.read_table(shard, columns=["subject_id"]).column("subject_id")
    return pc.unique(subjects).to_pylist()


def plan_shards(job: Job) -> list[ShardPlan]:
    """The records of each data shard (reading only the shards' `subject_id` column), in shard
    order; with labels, the label rows whose subject is in no shard as a last plan `_no_events`."""
    assert job.meds_dir is not None, "a MEDS job"
    shards = data_shards(job.meds_dir)
    points = read_labels(job.labels) if job.labels is not None else []
    by_split = None
    if job.split is not None:  # seeded (no subject_splits.parquet): the labels' or shards' subjects
        subjects = (
            [p.subject_id for p in points]
            if job.labels is not None
            else [s for shard in shards for s in _shard_subjects(shard)]
        )
        by_split = subject_split(job.meds_dir, subjects)

    def wanted(subject: int) -> bool:
        return by_split is None or by_split.keeps(subject, job.split)

    part, parts = job.partition or (0, 1)
    mine = [shard for k, shard in enumerate(shards) if k % parts == part]
    plans: list[ShardPlan] = []
    if job.labels is not None:
        by_subject: dict[int, list[Request]] = {}
        for index, point in enumerate(points):
            if wanted(point.subject_id):
                label = point.parsed(job.task).label
                request = Request(index, point.subject_id, point.prediction_time, label)
                by_subject.setdefault(point.subject_id, []).append(request)
        for shard in shards:
            requests = [r for s in _shard_subjects(shard) for r in by_subject.pop(s, [])]
            if shard not in mine:
                continue
            requests.sort(key=lambda r: r.record)
            plans.append(ShardPlan(shard_name(job.meds_dir, shard), shard, tuple(requests)))
        orphans = sorted((r for rs in by_subject.values() for r in rs), key=lambda r: r.record)
        if orphans and part == 0:
            plans.append(ShardPlan("_no_events", None, tuple(orphans)))
    else:
        record = 0
        for shard in shards:
            requests = []
            for subject in sorted(_shard_subjects(shard)):
                if wanted(subject):
                    for when in job.times:
                        requests.append(Request(record, subject, when))
                        record += 1
            if shard in mine:
                plans.append(ShardPlan(shard_name(job.meds_dir, shard), shard, tuple(requests)))
    return limited(plans, job.limit)


P = TypeVar("P", bound=ShardPlan)


def limited(plans: list[P], limit: int | None) -> list[P]:
    """The plans restricted to their first `limit` records (by record position)."""
    if limit is None:
        return plans
    kept = sorted(r.record for p in plans for r in p.requests)[:limit]
    last = kept[-1] if kept else -1
    return [p.up_to(last) for p in plans]


# --- scoring --------------------------------------------------------------------------------


def prepare_shard(
    predictor: Predictor, task: Task, meds_dir: Path, plan: ShardPlan
) -> Iterator[tuple[Request, PreparedRecord | RecordRow]]:
    """Each request of the shard with its prompt and ids (the record object every door prepares,
    `medtpe.inference.record.MedsRecord`), or its failure; the shard's events are read when the
    first record is asked for."""
    if not plan.requests:
        return
    dataset = MedsDataset.load(meds_dir, shards=[plan.path]) if plan.path is not None else None
    for request in plan.requests:
        try:
            events = dataset.events(request.subject_id) if dataset is not None else None
        except KeyError:
            events = None
        if events is None:
            yield request, failed(request, NO_EVENTS)
            continue
        try:
            yield request, MedsRecord(events, request.prediction_time).prepare(predictor, task)
        except Exception as exc:  # a record's bad data never stops the job
            yield request, failed(request, _reason("prepare", exc))


async def answer_record(
    engine: Engine,
    predictor: Predictor,
    job: Job,
    request: Request,
    prepared: PreparedRecord,
    recorder: RunRecorder | None = None,
) -> RecordRow:
    """The record's answer through `Predictor.answer` with the job's sampling, its ledger row
    kept by `recorder` (None: the ledger off); a generation error other than a dead engine
    becomes the record's failure."""
    start = time.perf_counter()
    try:
        answer = await predictor.answer(engine, prepared, job.sampling)
    except EngineDead:
        raise
    except Exception as exc:
        return failed(request, _reason("generate", exc), prepared)
    seg = prepared.segmentation
    prediction_id = None
    if recorder is not None:
        elapsed = time.perf_counter() - start
        prediction_id = recorder.add(prepared, job.sampling, answer, elapsed)
    return RecordRow(
        record=request.record,
        subject_id=request.subject_id,
        prediction_time=prepared.prediction_time,
        label=request.label,
        prediction=answer.prediction,
        format_ok=answer.format_ok,
        p_yes=positive_probability(prepared.task, answer.probabilities),
        answer=answer.samples[0].text if answer.samples else None,
        error=None if answer.format_ok else UNPARSED,
        original_tokens=len(seg.original_ids),
        medtpe_tokens=len(seg.medtpe_ids),
        generate_s=answer.generate_s,
        prediction_id=prediction_id,
    )


async def answer_all(
    engine: Engine,
    predictor: Predictor,
    job: Job,
    items: Iterable[tuple[Request, PreparedRecord | RecordRow]],
    on_done: Callable[[], object] = lambda: None,
    recorder: RunRecorder | None = None,
) -> list[RecordRow]:
    """The rows of `items`, in their order, with up to `job.concurrency` records in the
    engine at once, each answer's ledger row kept by `recorder`; `items` is consumed lazily,
    so the next record is prepared while the engine generates."""
    slots = asyncio.Semaphore(job.concurrency)

    async def one(request: Request, item: PreparedRecord | RecordRow) -> RecordRow:
        try:
            if isinstance(item, RecordRow):
                return item
            return await answer_record(engine, predictor, job, request, item, recorder)
        finally:
            slots.release()
            on_done()

    tasks = []
    for request, item in items:
        await slots.acquire()
        tasks.append(asyncio.create_task(one(request, item)))
    return list(await asyncio.gather(*tasks))


# --- output ---------------------------------------------------------------------------------


def predictions_path(out_dir: Path, name: str) -> Path:
    """Where a shard's predictions go."""
    return Path(out_dir) / f"{name}.parquet"


def records_path(out_dir: Path, name: str) -> Path:
    """Where a shard's per-record results go."""
    return Path(out_dir) / f"{name}{RECORDS_SUFFIX}"


def shard_done(out_dir: Path, name: str) -> bool:
    """Whether a shard's outputs are complete (its predictions file is written last)."""
    return predictions_path(out_dir, name).is_file() and records_path(out_dir, name).is_file()


def write_atomically(table: pa.Table, path: Path) -> None:
    """Write a parquet file under a temporary name beside `path`, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def write_shard(
    out_dir: Path, name: str, task: Task, rows: Sequence[RecordRow], labelled: bool
) -> None:
    """A shard's records file, then its predictions file (the completion mark)."""
    write_atomically(records_table(rows), records_path(out_dir, name))
    write_atomically(predictions_table(task, rows, labelled), predictions_path(out_dir, name))


def failure_kind(error: str) -> str:
    """A failure reason without its message (stage and exception type)."""
    return ": ".join(error.split(": ")[:2])


def summarise(out_dir: Path, run: dict[str, Any]) -> dict[str, Any]:
    """The summary of every records file under `out_dir` (this run's and earlier runs'), with
    this run's figures `run`; written to `<out_dir>/summary.json`."""
    n_records = failures = original_tokens = medtpe_tokens = 0
    kinds: Counter[str] = Counter()
    files = sorted(Path(out_dir).glob(f"**/*{RECORDS_SUFFIX}"))
    for path in files:
        table = read_records(path, ["error", "original_tokens", "medtpe_tokens"])
        errors = [e for e in table.column("error").to_pylist() if e is not None]
        n_records += table.num_rows
        failures += len(errors)
        kinds.update(failure_kind(e) for e in errors)
        original_tokens += pc.sum(table.column("original_tokens")).as_py() or 0
        medtpe_tokens += pc.sum(table.column("medtpe_tokens")).as_py() or 0
    summary = {
        "records": n_records,
        "shards": len(files),
        "failures": failures,
        "failure_kinds": dict(kinds.most_common()),
        "original_tokens": original_tokens,
        "medtpe_tokens": medtpe_tokens,
        "compression_rate": compression_rate(original_tokens, medtpe_tokens)
        if original_tokens
        else None,
        "this_run": run,
    }
    path = Path(out_dir) / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # jobs of a partition may race
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return summary


def job_settings(job: Job, model: LoadedModel) -> dict[str, Any]:
    """The settings a run records in its summary."""
    return {
        "task": job.task.name,
        "meds": None if job.meds_dir is None else str(job.meds_dir),
        "labels": None if job.labels is None else str(job.labels),
        "times": None if job.labels is not None else [str(t or "last") for t in job.times],
        "split": job.split,
        "partition": None if job.partition is None else "/".join(map(str, job.partition)),
        "limit": job.limit,
        "max_input_tokens": model.predictor.max_input_tokens,
        **job.sampling.as_dict(),
        "concurrency": job.concurrency,
        "model": asdict(model.identity),
        "descriptions": model.rendering.descriptions,
    }


# --- the local job --------------------------------------------------------------------------


def pending(plans: Sequence[ShardPlan], out_dir: Path) -> list[ShardPlan]:
    """The plans whose shard is not written yet."""
    return [p for p in plans if not shard_done(out_dir, p.name)]


ShardPreparer = Callable[
    [Predictor, Task, ShardPlan], Iterable[tuple[Request, PreparedRecord | RecordRow]]
]
"""Each request of a shard with its prepared prompt or its failure: `MedsShards` for a MEDS
dataset's shards; other inputs bring their own (`medtpe.batch.fhir_job`). Pickled to Ray's
actors."""


@dataclass(frozen=True)
class MedsShards:
    """The `ShardPreparer` of a MEDS dataset's data shards (`prepare_shard`)."""

    meds_dir: Path

    def __call__(
        self, predictor: Predictor, task: Task, plan: ShardPlan
    ) -> Iterator[tuple[Request, PreparedRecord | RecordRow]]:
        return prepare_shard(predictor, task, self.meds_dir, plan)


def run_local(
    config: ModelConfig,
    job: Job,
    out_dir: Path,
    engine_factory: EngineFactory = start_vllm,
    ledger: LedgerSettings | None = None,
) -> dict[str, Any]:
    """Score every pending shard on one engine in this process, each shard's ledger rows
    committed (`ledger`: default the `MEDTPE_LEDGER_*` environment's) before its files are
    written; returns (and writes) the summary."""
    return run_plans(
        config,
        job,
        plan_shards(job),
        MedsShards(job.meds_dir),
        out_dir,
        {},
        engine_factory,
        ledger,
    )


def run_ledger(
    job: Job,
    model: LoadedModel,
    out_dir: Path,
    prepare: ShardPreparer,
    ledger: LedgerSettings | None,
) -> RunLedger:
    """Where a run records its answers: `ledger` (default: the `MEDTPE_LEDGER_*`
    environment's), this run's identity (`run_identity`), the door of its input (`MedsShards`:
    MEDS, else FHIR)."""
    settings = ledger or LedgerSettings.from_environ()
    door = "batch_meds" if isinstance(prepare, MedsShards) else "batch_fhir"
    return RunLedger(settings, run_identity(out_dir, model, job.sampling), door)


def run_plans(
    config: ModelConfig,
    job: Job,
    plans: Sequence[ShardPlan],
    prepare: ShardPreparer,
    out_dir: Path,
    settings: dict[str, Any],
    engine_factory: EngineFactory = start_vllm,
    ledger: LedgerSettings | None = None,
) -> dict[str, Any]:
    """`run_local` of `plans` whose records `prepare` prepares (the job's settings in the summary
    updated by `settings`)."""
    todo = pending(plans, out_dir)
    model = load_model(config)
    n_todo = sum(len(p.requests) for p in todo)
    recorder = run_ledger(job, model, out_dir, prepare, ledger).open(model) if n_todo else None
    start = time.perf_counter()
    engine = engine_factory(model.engine_config) if n_todo else None
    started = time.perf_counter()
    if recorder is not None:
        recorder.engine = engine
    try:
        asyncio.run(
            _score_plans(engine, model.predictor, job, todo, out_dir, n_todo, prepare, recorder)
        )
    finally:
        if engine is not None:
            engine.shutdown()
        if recorder is not None:
            recorder.close()
    run = run_figures("local", plans, todo, start, started, time.perf_counter())
    return summarise(out_dir, {**run, **job_settings(job, model), **settings})


def run_figures(
    runner: str,
    plans: Sequence[ShardPlan],
    todo: Sequence[ShardPlan],
    start: float,
    started: float,
    end: float,
) -> dict[str, Any]:
    """A run's own figures: shards written and skipped, records scored, time to start the
    engine(s), time scoring and records per second of scoring."""
    n_todo = sum(len(p.requests) for p in todo)
    scoring = end - started
    return {
        "runner": runner,
        "shards_written": len(todo),
        "shards_skipped": len(plans) - len(todo),
        "records": n_todo,
        "engine_start_s": started - start,
        "scoring_s": scoring,
        "records_per_s": n_todo / scoring if n_todo and scoring > 0 else None,
    }


async def _score_plans(
    engine: Engine | None,
    predictor: Predictor,
    job: Job,
    plans: Sequence[ShardPlan],
    out_dir: Path,
    total: int,
    prepare: ShardPreparer,
    recorder: RunRecorder | None,
) -> None:
    with tqdm(total=total, desc="predict", unit="record") as progress:
        for plan in plans:
            items = prepare(predictor, job.task, plan)
            rows = (
                await answer_all(engine, predictor, job, items, lambda: progress.update(), recorder)
                if engine is not None
                else []
            )
            if recorder is not None:  # the rows before the answers' files
                await asyncio.to_thread(recorder.commit)
            write_shard(out_dir, plan.name, job.task, rows, job.labels is not None)
