"""`medtpe predict --ray`: the batch job of `medtpe.batch.job` on Ray Data.

The pipeline, over the shards not written yet:

1. one row per data shard (`from_items`, one block each);
2. `flat_map` on CPU actors (`PrepareShard`, `--cpu-workers`): each reads its shard with the
   project's MEDS reader and renders + MedTPE-encodes the records, once for every task asked
   (`Predictor.prepare_all`), one row per record;
3. `map_batches` on generation actors (`GenerateAnswers`, `--engines`), each holding one engine
   (`medtpe.inference.engines.factories.start_vllm`) and answering a shard's block of records
   through `Predictor.answer_all`, `--concurrency` at a time, as the local job does (same batches
   in the engine, so the same p(yes) to the last bit; Ray splits a block only beyond 128 MiB): one
   row per record and task;
4. a hash repartition by shard, so each shard's rows end in one block, and Ray Data's
   `write_parquet` (partitioned by shard and task) writes the records files and the predictions
   files into a staging directory beside `--out`; when the write has finished, each shard's files
   are renamed into place, task after task (`<out>/<shard>.records.pq`, then
   `<out>/<shard>.parquet`; with several tasks under `<out>/<task>/`).

A shard is read whole by one task, not split into row-group blocks by `read_parquet`: MEDS keeps a
subject's events in one shard, and blocks would need a shuffle of every event to put a record's
events back together. Resuming skips every shard written by an earlier run, local or Ray; a run
stopped before its write finished leaves nothing in `--out` and is redone.

`ray.data.llm` was not used: Ray 2.60's vLLM stage does send `TokensPrompt(prompt_token_ids=...)`
when a row carries `tokenized_prompt` (`vllm_engine_stage.py`), so MedTPE ids would reach vLLM,
but the stage builds its own engine and sampling parameters and returns raw outputs: the prefill,
answer constraint, option probabilities and answer parsing of `Predictor.answer` would have to
be rebuilt around it, and the predictions could differ from the service's.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medtpe.batch.job import (
    Job,
    MedsShards,
    PrefixReuse,
    ShardPlan,
    ShardPreparer,
    answer_all,
    job_settings,
    pending,
    plan_shards,
    run_figures,
    run_ledger,
)
from medtpe.batch.ledger_rows import RunLedger
from medtpe.batch.rows import RecordRow, predictions_table, records_table
from medtpe.batch.task_outputs import (
    predictions_path,
    records_path,
    summarise,
    task_dir,
    write_atomically,
    write_tasks,
)
from medtpe.core.ray_cluster import LOCAL, ray_session
from medtpe.inference.engines.factories import start_vllm
from medtpe.inference.engines.protocol import EngineFactory
from medtpe.inference.model import ModelConfig, load_model
from medtpe.ledger.settings import LedgerSettings

SHARD = "shard"
"""Partition column: the shard's index among the run's pending plans."""
TASK = "task"
"""Partition column: the task's index among the job's tasks."""
PROMPT_TOKENS = "prompt_tokens"
CACHED_TOKENS = "cached_tokens"
"""The answers' `Answered` figures, summed into the run's `PrefixReuse`, never written."""


@dataclass(frozen=True)
class RayResources:
    """Where the job runs and how many actors of each kind it uses."""

    address: str = LOCAL
    """A running cluster (`ray://...`, `auto`, host:port), or `LOCAL`: a local cluster for the job
    (`medtpe.core.ray_cluster.ray_session`)."""
    num_cpus: int | None = None
    """CPUs of the local cluster (None: the machine's)."""
    engines: int = 1
    cpu_workers: int = 1
    engine_cpus: float = 1.0
    engine_gpus: float = 0.0


class PrepareShard:
    """CPU actor: a shard's records rendered and encoded (`prepare`: the job's
    `medtpe.batch.job.ShardPreparer`)."""

    def __init__(self, config: ModelConfig, job: Job, prepare: ShardPreparer) -> None:
        self._prepare = prepare
        self.predictor = load_model(config).predictor
        self.job = job

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """One row per record: its shard, position and pickled (request, prepared or failure)."""
        plan: ShardPlan = pickle.loads(row["plan"])
        items = self._prepare(self.predictor, self.job.tasks, plan)
        return [
            {SHARD: row[SHARD], "record": request.record, "item": pickle.dumps((request, item))}
            for request, item in items
        ]


class GenerateAnswers:
    """Generation actor: one engine, answering batches of prepared records."""

    def __init__(
        self,
        config: ModelConfig,
        job: Job,
        ledger: RunLedger,
        engine_factory: EngineFactory = start_vllm,
    ) -> None:
        model = load_model(config)
        self.predictor = model.predictor
        self.job = job
        self.loop = asyncio.new_event_loop()
        self.recorder = ledger.open(model)
        self.engine = engine_factory(model.engine_config)
        if self.recorder is not None:
            self.recorder.engine = self.engine

    def __call__(self, batch: dict[str, Any]) -> pa.Table:
        """The records file rows of a batch, each task's, with their shard, task and prefix
        figures; the batch's ledger rows committed first."""
        items = [pickle.loads(item) for item in batch["item"]]
        answered = self.loop.run_until_complete(
            answer_all(self.engine, self.predictor, self.job, items, recorder=self.recorder)
        )
        if self.recorder is not None:
            self.recorder.commit()
        shard_of = dict(zip(batch["record"].tolist(), batch[SHARD].tolist(), strict=True))
        parts = []
        for index in range(len(self.job.tasks)):
            results = sorted((record[index] for record in answered), key=lambda a: a.row.record)
            columns = {
                SHARD: pa.array([shard_of[a.row.record] for a in results], pa.int64()),
                TASK: pa.array([index] * len(results), pa.int64()),
                PROMPT_TOKENS: pa.array([a.prompt_tokens for a in results], pa.int64()),
                CACHED_TOKENS: pa.array([a.cached_tokens for a in results], pa.int64()),
            }
            table = records_table([a.row for a in results])
            for name, column in columns.items():
                table = table.append_column(name, column)
            parts.append(table)
        return pa.concat_tables(parts)

    def __del__(self) -> None:
        self.engine.shutdown()
        if self.recorder is not None:
            self.recorder.close()


def _predictions(batch: pa.Table, job: Job) -> pa.Table:
    """The predictions rows of a block of records rows (one or more whole shards, each task's)."""
    parts = []
    keys = sorted(set(zip(batch[SHARD].to_pylist(), batch[TASK].to_pylist(), strict=True)))
    for shard, task in keys:
        mine = pc.and_(pc.equal(batch[SHARD], shard), pc.equal(batch[TASK], task))
        rows = batch.filter(mine).drop_columns([SHARD, TASK])
        records = [RecordRow.from_row(r) for r in rows.to_pylist()]
        table = predictions_table(job.tasks[task], records, job.labels is not None)
        table = table.append_column(SHARD, pa.array([shard] * table.num_rows, pa.int64()))
        parts.append(table.append_column(TASK, pa.array([task] * table.num_rows, pa.int64())))
    return pa.concat_tables(parts)


def _sorted(batch: pa.Table) -> pa.Table:
    order = [(SHARD, "ascending"), (TASK, "ascending"), ("record", "ascending")]
    return batch.sort_by(order)


def _prefix_reuse(answers: pa.Table) -> PrefixReuse:
    """The `PrefixReuse` of the answers' prefix figures (`PROMPT_TOKENS`, `CACHED_TOKENS`)."""
    given = pc.greater(answers[PROMPT_TOKENS], 0)
    cached = answers[CACHED_TOKENS]
    return PrefixReuse(
        answers=pc.sum(given.cast(pa.int64())).as_py() or 0,
        reusing=pc.sum(pc.and_(given, pc.greater(cached, 0)).cast(pa.int64())).as_py() or 0,
        prompt_tokens=pc.sum(answers[PROMPT_TOKENS]).as_py() or 0,
        cached_tokens=pc.sum(cached).as_py() or 0,
    )


def run_ray(
    config: ModelConfig,
    job: Job,
    out_dir: Path,
    resources: RayResources,
    shards: tuple[Sequence[ShardPlan], ShardPreparer] | None = None,
    settings: dict[str, Any] | None = None,
    ledger: LedgerSettings | None = None,
    engine_factory: EngineFactory = start_vllm,
) -> dict[str, Any]:
    """Score every pending shard on Ray Data (see the module docstring), each answer recorded in
    `ledger` (default: the `MEDTPE_LEDGER_*` environment's), each generation actor's engine
    started by `engine_factory`; returns (and writes) the summary. `shards`: other plans than
    the MEDS dataset's and their preparer (the job's settings in the summary updated by
    `settings`)."""
    if shards is None:
        assert job.meds_dir is not None, "a MEDS job, or its shards"
        shards = plan_shards(job), MedsShards(job.meds_dir)
    plans, prepare = shards
    todo = pending(plans, out_dir, job.tasks)
    model = load_model(config)  # the prepared files checked once, here
    start = time.perf_counter()
    with_records = [p for p in todo if p.requests]
    for plan in todo:
        if not plan.requests:
            write_tasks(out_dir, plan.name, job.tasks, [], job.labels is not None)
    reuse = PrefixReuse()
    if with_records:
        recording = run_ledger(job, model, out_dir, prepare, ledger)
        checked = recording.open(model)  # fail closed before any actor starts
        if checked is not None:
            checked.close()
        with ray_session(resources.address, resources.num_cpus):
            reuse = _run_pipeline(
                config, job, out_dir, with_records, resources, prepare, recording, engine_factory
            )
    run = run_figures("ray", plans, todo, start, start, time.perf_counter(), reuse)
    run["engine_start_s"] = None  # the actors start their engines inside the pipeline's time
    run["ray"] = {
        "address": resources.address,
        "num_cpus": resources.num_cpus,
        "engines": resources.engines,
        "cpu_workers": resources.cpu_workers,
        "engine_cpus": resources.engine_cpus,
        "engine_gpus": resources.engine_gpus,
    }
    return summarise(out_dir, {**run, **job_settings(job, model), **(settings or {})}, job.tasks)


def _run_pipeline(
    config: ModelConfig,
    job: Job,
    out_dir: Path,
    plans: Sequence[ShardPlan],
    resources: RayResources,
    prepare: ShardPreparer,
    ledger: RunLedger,
    engine_factory: EngineFactory,
) -> PrefixReuse:
    """Run the pipeline of the module docstring over `plans` and move each shard's files into
    place; what the engines' prefix caches spared."""
    import ray

    shards = [{SHARD: i, "plan": pickle.dumps(plan)} for i, plan in enumerate(plans)]
    records = (
        ray.data.from_items(shards, override_num_blocks=len(shards))
        .flat_map(
            PrepareShard,
            fn_constructor_kwargs={"config": config, "job": job, "prepare": prepare},
            concurrency=resources.cpu_workers,
            num_cpus=1,
        )
        .map_batches(
            GenerateAnswers,
            fn_constructor_kwargs={
                "config": config,
                "job": job,
                "ledger": ledger,
                "engine_factory": engine_factory,
            },
            batch_size=None,  # a whole block: one shard's records, as the local job streams them
            batch_format="numpy",
            concurrency=resources.engines,
            num_cpus=resources.engine_cpus,
            num_gpus=resources.engine_gpus,
        )
        .repartition(len(plans), keys=[SHARD])
        .map_batches(_sorted, batch_size=None, batch_format="pyarrow")
        .materialize()
    )
    reuse = _prefix_reuse(
        pa.concat_tables(
            ray.get(records.select_columns([PROMPT_TOKENS, CACHED_TOKENS]).to_arrow_refs())
        )
    )
    records = records.drop_columns([PROMPT_TOKENS, CACHED_TOKENS])
    staging = Path(out_dir).parent / f".{Path(out_dir).name}.ray-{uuid.uuid4().hex[:8]}"
    try:
        records.write_parquet(str(staging / "records"), partition_cols=[SHARD, TASK])
        records.map_batches(
            _predictions, fn_kwargs={"job": job}, batch_size=None, batch_format="pyarrow"
        ).write_parquet(str(staging / "predictions"), partition_cols=[SHARD, TASK])
        no_records = records_table([])
        for index, plan in enumerate(plans):
            for number, task in enumerate(job.tasks):
                partition = Path(f"{SHARD}={index}") / f"{TASK}={number}"
                where = task_dir(out_dir, job.tasks, task)
                no_predictions = predictions_table(task, [], job.labels is not None)
                _move(staging / "records" / partition, records_path(where, plan.name), no_records)
                _move(
                    staging / "predictions" / partition,
                    predictions_path(where, plan.name),
                    no_predictions,
                )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return reuse


def _move(partition: Path, path: Path, empty: pa.Table) -> None:
    """A shard's partition directory as one file at `path`: renamed when Ray wrote one file,
    else concatenated (`empty` when Ray wrote none: the shard has no such rows)."""
    files = sorted(partition.glob("*.parquet"))
    if len(files) == 1:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(files[0], path)
        return
    tables = [pq.read_table(f) for f in files]
    write_atomically(pa.concat_tables(tables) if tables else empty, path)
