"""`medtpe predict --ray`: the batch job of `medtpe.batch.job` on Ray Data.

The pipeline, over the shards not written yet:

1. one row per data shard (`from_items`, one block each);
2. `flat_map` on CPU actors (`PrepareShard`, `--cpu-workers`): each reads its shard with the
   project's MEDS reader and renders + MedTPE-encodes the records (`Predictor.prepare`), one
   row per record;
3. `map_batches` on generation actors (`GenerateAnswers`, `--engines`), each holding one engine
   (`medtpe.inference.engines.factories.start_vllm`) and answering a shard's block of records
   through `Predictor.answer`, `--concurrency` at a time, as the local job does (same batches in the
   engine, so the same p(yes) to the last bit; Ray splits a block only beyond 128 MiB);
4. a hash repartition by shard, so each shard's rows end in one block, and Ray Data's
   `write_parquet` (partitioned by shard) writes the records files and the predictions files into
   a staging directory beside `--out`; when the write has finished, each shard's files are renamed
   into place (`<out>/<shard>.records.pq`, then `<out>/<shard>.parquet`).

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
    ShardPlan,
    ShardPreparer,
    answer_all,
    job_settings,
    pending,
    plan_shards,
    predictions_path,
    records_path,
    run_figures,
    run_ledger,
    summarise,
    write_atomically,
    write_shard,
)
from medtpe.batch.ledger_rows import RunLedger
from medtpe.batch.rows import RecordRow, predictions_table, records_table
from medtpe.core.ray_cluster import LOCAL, ray_session
from medtpe.inference.engines.factories import start_vllm
from medtpe.inference.model import ModelConfig, load_model
from medtpe.ledger.settings import LedgerSettings

SHARD = "shard"
"""Partition column: the shard's index among the run's pending plans."""


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
        items = self._prepare(self.predictor, self.job.task, plan)
        return [
            {SHARD: row[SHARD], "record": request.record, "item": pickle.dumps((request, item))}
            for request, item in items
        ]


class GenerateAnswers:
    """Generation actor: one engine, answering batches of prepared records."""

    def __init__(self, config: ModelConfig, job: Job, ledger: RunLedger) -> None:
        model = load_model(config)
        self.predictor = model.predictor
        self.job = job
        self.loop = asyncio.new_event_loop()
        self.recorder = ledger.open(model)
        self.engine = start_vllm(model.engine_config)
        if self.recorder is not None:
            self.recorder.engine = self.engine

    def __call__(self, batch: dict[str, Any]) -> pa.Table:
        """The records file rows of a batch, with their shard; the batch's ledger rows
        committed first."""
        items = [pickle.loads(item) for item in batch["item"]]
        rows = self.loop.run_until_complete(
            answer_all(self.engine, self.predictor, self.job, items, recorder=self.recorder)
        )
        if self.recorder is not None:
            self.recorder.commit()
        table = records_table(rows)
        shards = dict(zip(batch["record"].tolist(), batch[SHARD].tolist(), strict=True))
        return table.append_column(
            SHARD, pa.array([shards[o] for o in table["record"].to_pylist()])
        )

    def __del__(self) -> None:
        self.engine.shutdown()
        if self.recorder is not None:
            self.recorder.close()


def _predictions(batch: pa.Table, job: Job) -> pa.Table:
    """The predictions rows of a block of records rows (one or more whole shards)."""
    parts = []
    for shard in sorted(set(batch[SHARD].to_pylist())):
        rows = batch.filter(pc.equal(batch[SHARD], shard)).drop_columns([SHARD])
        records = [RecordRow.from_row(r) for r in rows.to_pylist()]
        table = predictions_table(job.task, records, job.labels is not None)
        parts.append(table.append_column(SHARD, pa.array([shard] * table.num_rows, pa.int64())))
    return pa.concat_tables(parts)


def _sorted(batch: pa.Table) -> pa.Table:
    return batch.sort_by([(SHARD, "ascending"), ("record", "ascending")])


def run_ray(
    config: ModelConfig,
    job: Job,
    out_dir: Path,
    resources: RayResources,
    shards: tuple[Sequence[ShardPlan], ShardPreparer] | None = None,
    settings: dict[str, Any] | None = None,
    ledger: LedgerSettings | None = None,
) -> dict[str, Any]:
    """Score every pending shard on Ray Data (see the module docstring), each answer recorded in
    `ledger` (default: the `MEDTPE_LEDGER_*` environment's); returns (and writes) the summary.
    `shards`: other plans than the MEDS dataset's and their preparer (the job's settings in the
    summary updated by `settings`)."""
    if shards is None:
        assert job.meds_dir is not None, "a MEDS job, or its shards"
        shards = plan_shards(job), MedsShards(job.meds_dir)
    plans, prepare = shards
    todo = pending(plans, out_dir)
    model = load_model(config)  # the prepared files checked once, here
    start = time.perf_counter()
    with_records = [p for p in todo if p.requests]
    for plan in todo:
        if not plan.requests:
            write_shard(out_dir, plan.name, job.task, [], job.labels is not None)
    if with_records:
        recording = run_ledger(job, model, out_dir, prepare, ledger)
        checked = recording.open(model)  # fail closed before any actor starts
        if checked is not None:
            checked.close()
        with ray_session(resources.address, resources.num_cpus):
            _run_pipeline(config, job, out_dir, with_records, resources, prepare, recording)
    run = run_figures("ray", plans, todo, start, start, time.perf_counter())
    run["engine_start_s"] = None  # the actors start their engines inside the pipeline's time
    run["ray"] = {
        "address": resources.address,
        "num_cpus": resources.num_cpus,
        "engines": resources.engines,
        "cpu_workers": resources.cpu_workers,
        "engine_cpus": resources.engine_cpus,
        "engine_gpus": resources.engine_gpus,
    }
    return summarise(out_dir, {**run, **job_settings(job, model), **(settings or {})})


def _run_pipeline(
    config: ModelConfig,
    job: Job,
    out_dir: Path,
    plans: Sequence[ShardPlan],
    resources: RayResources,
    prepare: ShardPreparer,
    ledger: RunLedger,
) -> None:
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
            fn_constructor_kwargs={"config": config, "job": job, "ledger": ledger},
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
    staging = Path(out_dir).parent / f".{Path(out_dir).name}.ray-{uuid.uuid4().hex[:8]}"
    try:
        records.write_parquet(str(staging / "records"), partition_cols=[SHARD])
        records.map_batches(
            _predictions, fn_kwargs={"job": job}, batch_size=None, batch_format="pyarrow"
        ).write_parquet(str(staging / "predictions"), partition_cols=[SHARD])
        no_records = records_table([])
        no_predictions = predictions_table(job.task, [], job.labels is not None)
        for index, plan in enumerate(plans):
            partition = f"{SHARD}={index}"
            _move(staging / "records" / partition, records_path(out_dir, plan.name), no_records)
            _move(
                staging / "predictions" / partition,
                predictions_path(out_dir, plan.name),
                no_predictions,
            )
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
