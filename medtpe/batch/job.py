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
and renamed (`medtpe.batch.task_outputs`), the predictions file last, so a shard whose predictions
file exists is complete and a second run skips it (resume). The label file itself is read whole
(a few numbers per record).

Several tasks (`Job.more_tasks`, `medtpe predict --task a,b,c`) are asked about each record with
one read of its events and one render of it (`MedsRecord.prepare_all`): the record is rendered
once within what the longest task's text leaves, and in the `record-first` layout the tasks'
prompts share their ids up to the end of the record, so the engine's prefix cache computes it
once (`Predictor.answer_all`; `PrefixReuse` counts what it spared). Each task gets the files
above in a directory of its own, `<out>/<task>/` (one task: `<out>/` itself), and its answers
their own ledger rows; a shard is complete when every task's predictions file exists (each
task's files are written in turn, so a run stopped between them scores the shard again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Self, TypeVar

import meds
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from medtpe.batch.ledger_rows import RunLedger, RunRecorder, run_identity
from medtpe.batch.rows import RecordRow
from medtpe.batch.task_outputs import Answered, shard_done, summarise, write_tasks
from medtpe.core.meds.readers import MedsDataset, data_shards, read_labels
from medtpe.core.meds.subject_split import subject_split
from medtpe.core.tasks import Prediction, Task
from medtpe.core.tasks.option_probabilities import positive_probability
from medtpe.inference.engines.factories import start_vllm
from medtpe.inference.engines.protocol import Engine, EngineDead, EngineFactory
from medtpe.inference.model import LoadedModel, ModelConfig, load_model
from medtpe.inference.predictor import Answer, Predictor, PreparedRecord
from medtpe.inference.record import MedsRecord
from medtpe.inference.sampling import Sampling
from medtpe.ledger.settings import LedgerSettings

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
    """The task asked (with `more_tasks`: the first of them)."""
    labels: Path | None = None
    """A MEDS label file of `task` (not with `more_tasks`: a label file labels one task)."""
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
    more_tasks: tuple[Task, ...] = ()
    """Further tasks asked about each record with `task`, from one read and render of it."""

    def __post_init__(self) -> None:
        if self.labels is not None and self.more_tasks:
            raise ValueError("a label file labels one task: score several tasks at given times")

    @property
    def tasks(self) -> tuple[Task, ...]:
        """Every task the job asks about each record, `task` first."""
        return (self.task, *self.more_tasks)


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


Prepared = list[PreparedRecord] | RecordRow
"""A record's prompt for each task asked (in the job's order), or its failure (every task's)."""


def prepare_shard(
    predictor: Predictor, tasks: Sequence[Task], meds_dir: Path, plan: ShardPlan
) -> Iterator[tuple[Request, Prepared]]:
    """Each request of the shard with its prompt and ids for each of `tasks`, the record read
    and rendered once for all of them (the record object every door prepares,
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
            record = MedsRecord(events, request.prediction_time)
            yield request, record.prepare_all(predictor, tasks)
        except Exception as exc:  # a record's bad data never stops the job
            yield request, failed(request, _reason("prepare", exc))


@dataclass
class PrefixReuse:
    """What the engine's prefix cache spared a run: of the prompts it was given (`answers`),
    how many found a prefix computed before (`reusing`: in the `record-first` layout, the record
    prefilled once for the tasks asked of it), and their tokens, given and read from the cache."""

    answers: int = 0
    reusing: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def add(self, answered: Iterable[Answered]) -> None:
        """Count the prompts of `answered` that reached the engine."""
        for one in answered:
            if one.prompt_tokens:
                self.answers += 1
                self.reusing += one.cached_tokens > 0
                self.prompt_tokens += one.prompt_tokens
                self.cached_tokens += one.cached_tokens

    def as_dict(self) -> dict[str, Any]:
        """The summary's figures, with the share of prompt tokens read from the cache."""
        share = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None
        return {**asdict(self), "cached_share": share}

    @classmethod
    def of(cls, figures: Mapping[str, Any]) -> PrefixReuse:
        """The counts of a summary's figures (`as_dict`)."""
        return cls(**{f.name: figures[f.name] for f in fields(cls)})

    def line(self) -> str:
        """One line for the progress bar and the command's output."""
        return (
            f"{self.reusing}/{self.answers} prefills shared, "
            f"{self.cached_tokens}/{self.prompt_tokens} prompt tokens from the prefix cache"
        )


async def answer_record(
    engine: Engine,
    predictor: Predictor,
    job: Job,
    request: Request,
    prepared: Sequence[PreparedRecord],
    recorder: RunRecorder | None = None,
) -> list[Answered]:
    """The record's answer to each task through `Predictor.answer_all` (the record prefilled
    once, then every task together on the record the engine has cached) with the job's
    sampling, each answer's ledger row kept by `recorder` (None: the ledger off); a generation
    error other than a dead engine becomes the record's failure for every task."""
    start = time.perf_counter()
    try:
        answers = await predictor.answer_all(engine, prepared, job.sampling)
    except EngineDead:
        raise
    except Exception as exc:
        return [Answered(failed(request, _reason("generate", exc), p)) for p in prepared]
    elapsed = time.perf_counter() - start
    return [
        Answered(
            _answered_row(request, one, answer, recorder, job.sampling, elapsed),
            len(predictor.engine_ids(one.segmentation)),
            answer.cached_tokens,
        )
        for one, answer in zip(prepared, answers, strict=True)
    ]


def _answered_row(
    request: Request,
    prepared: PreparedRecord,
    answer: Answer,
    recorder: RunRecorder | None,
    sampling: Sampling,
    elapsed: float,
) -> RecordRow:
    """The records-file row of an answer, its ledger row kept by `recorder`."""
    seg = prepared.segmentation
    prediction_id = None
    if recorder is not None:
        prediction_id = recorder.add(prepared, sampling, answer, elapsed)
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
    items: Iterable[tuple[Request, Prepared]],
    on_done: Callable[[], object] = lambda: None,
    recorder: RunRecorder | None = None,
) -> list[list[Answered]]:
    """Each task's result for each record of `items` (in their order; per record, in the
    job's task order), with up to `job.concurrency` records in the engine at once, each
    answer's ledger row kept by `recorder`; `items` is consumed lazily, so the next record is
    prepared while the engine generates."""
    slots = asyncio.Semaphore(job.concurrency)

    async def one(request: Request, item: Prepared) -> list[Answered]:
        try:
            if isinstance(item, RecordRow):
                return [Answered(item)] * len(job.tasks)
            return await answer_record(engine, predictor, job, request, item, recorder)
        finally:
            slots.release()
            on_done()

    tasks = []
    for request, item in items:
        await slots.acquire()
        tasks.append(asyncio.create_task(one(request, item)))
    return list(await asyncio.gather(*tasks))


def job_settings(job: Job, model: LoadedModel) -> dict[str, Any]:
    """The settings a run records in its summary."""
    return {
        "task": ",".join(task.name for task in job.tasks),
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


def pending(plans: Sequence[ShardPlan], out_dir: Path, tasks: Sequence[Task]) -> list[ShardPlan]:
    """The plans whose shard is not written yet for every one of `tasks`."""
    return [p for p in plans if not shard_done(out_dir, p.name, tasks)]


ShardPreparer = Callable[[Predictor, Sequence[Task], ShardPlan], Iterable[tuple[Request, Prepared]]]
"""Each request of a shard with its prepared prompt for each task, or its failure: `MedsShards`
for a MEDS dataset's shards; other inputs bring their own (`medtpe.batch.fhir_job`). Pickled to
Ray's actors."""


@dataclass(frozen=True)
class MedsShards:
    """The `ShardPreparer` of a MEDS dataset's data shards (`prepare_shard`)."""

    meds_dir: Path

    def __call__(
        self, predictor: Predictor, tasks: Sequence[Task], plan: ShardPlan
    ) -> Iterator[tuple[Request, Prepared]]:
        return prepare_shard(predictor, tasks, self.meds_dir, plan)


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
    run = run_identity(out_dir, model, job.sampling, [task.name for task in job.tasks])
    return RunLedger(settings, run, door)


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
    todo = pending(plans, out_dir, job.tasks)
    model = load_model(config)
    n_todo = sum(len(p.requests) for p in todo)
    reuse = PrefixReuse()
    recorder = run_ledger(job, model, out_dir, prepare, ledger).open(model) if n_todo else None
    start = time.perf_counter()
    engine = engine_factory(model.engine_config) if n_todo else None
    started = time.perf_counter()
    if recorder is not None:
        recorder.engine = engine
    try:
        asyncio.run(
            _score_plans(
                engine, model.predictor, job, todo, out_dir, n_todo, prepare, recorder, reuse
            )
        )
    finally:
        if engine is not None:
            engine.shutdown()
        if recorder is not None:
            recorder.close()
    run = run_figures("local", plans, todo, start, started, time.perf_counter(), reuse)
    return summarise(out_dir, {**run, **job_settings(job, model), **settings}, job.tasks)


def run_figures(
    runner: str,
    plans: Sequence[ShardPlan],
    todo: Sequence[ShardPlan],
    start: float,
    started: float,
    end: float,
    reuse: PrefixReuse,
) -> dict[str, Any]:
    """A run's own figures: shards written and skipped, records scored, time to start the
    engine(s), time scoring, records per second of scoring and what the engine's prefix cache
    spared (`reuse`)."""
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
        "prefix_cache": reuse.as_dict(),
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
    reuse: PrefixReuse,
) -> None:
    with tqdm(total=total, desc="predict", unit="record") as progress:
        for plan in plans:
            items = prepare(predictor, job.tasks, plan)
            answered = (
                await answer_all(engine, predictor, job, items, lambda: progress.update(), recorder)
                if engine is not None
                else []
            )
            for record in answered:
                reuse.add(record)
            progress.set_postfix_str(reuse.line())
            if recorder is not None:  # the rows before the answers' files
                await asyncio.to_thread(recorder.commit)
            write_tasks(out_dir, plan.name, job.tasks, answered, job.labels is not None)
