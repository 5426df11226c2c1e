"""The fidelity gate of `medtpe build-artefact`: the held-out windows answered by the original
model and by the MedTPE model at each serving budget, through the service's own path (the
export written first, then `medtpe.inference.model.load_model`, `Predictor`, the engine and its stop
rule, the service's default decoding: answer prefill, greedy, 64 new tokens), and the paired
figures of `medtpe.core.metrics.fidelity` held against the build's thresholds.

One engine per mode serves every budget (its context fits the largest); prefix caching is off,
so each answer pays its whole prompt as a first request would. Both run in the build's
`gate_dtype` (float32 by default: the rows' own error, the same on every machine).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from medtpe.core.meds import PredictionPoint
from medtpe.core.meds.readers import MedsDataset, data_shards
from medtpe.core.metrics.fidelity import Thresholds, fidelity
from medtpe.core.tasks import get_task
from medtpe.evaluation.figures import MODES, aligned, paired_answers
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.records import EvalRecord
from medtpe.evaluation.runner import evaluate_mode, measured
from medtpe.inference.engines.protocol import EngineFactory
from medtpe.inference.model import ModelConfig, load_model
from medtpe.inference.sampling import Sampling
from medtpe.training.export import ensure_export

SERVICE_SAMPLING = Sampling()
"""The service's default decoding (greedy, 64 new tokens, free, the task's prefill), the answer
options' probabilities asked for."""


def gate_records(meds: Path, windows: Sequence[PredictionPoint]) -> dict[str, list[EvalRecord]]:
    """The gate's windows (points with a task) as unlabelled records, by task, read one data
    shard at a time."""
    wanted = {w.subject_id for w in windows}
    events = {}
    for shard in data_shards(meds):
        dataset = MedsDataset.load(meds, [shard])
        for subject in wanted.intersection(dataset.subject_ids):
            events[subject] = dataset.events(subject)
    by_task: dict[str, list[EvalRecord]] = {}
    for w in windows:
        record = EvalRecord(replace(w, label=None), events[w.subject_id])
        by_task.setdefault(str(w.task), []).append(record)
    return by_task


async def _answer_all(
    config: ModelConfig,
    records: Mapping[str, Sequence[EvalRecord]],
    budgets: Sequence[int],
    engine_factory: EngineFactory,
) -> dict[int, list[RecordResult]]:
    """One mode's results at each budget (records of every task), on one engine."""
    model = load_model(measured(config))
    engine = engine_factory(model.engine_config)
    results: dict[int, list[RecordResult]] = {}
    try:
        for budget in budgets:
            predictor = model.predictor.at_budget(budget)
            results[budget] = []
            for task, task_records in records.items():
                results[budget] += await evaluate_mode(
                    engine, predictor, get_task(task), task_records, SERVICE_SAMPLING
                )
    finally:
        engine.shutdown()
    return results


def run_gate(
    config: ModelConfig,
    records: Mapping[str, Sequence[EvalRecord]],
    budgets: Sequence[int],
    thresholds: Thresholds,
    engine_factory: EngineFactory,
) -> dict[str, Any]:
    """Answer `records` in both modes at each budget (`config`: the MedTPE mode's model; the
    original mode uses its base checkpoint) and hold each budget's fidelity to `thresholds`.
    Returns {budget: {"dtype", "fidelity", "failures", "records"}} with budgets as
    strings (JSON); `records` holds each record's result in both modes (`RecordResult`), so a
    failed gate shows which windows disagree and what each model wrote."""
    ensure_export(config.model_dir, config.artefact_dir, config.export_dir)
    by_mode = {
        mode: asyncio.run(_answer_all(replace(config, mode=mode), records, budgets, engine_factory))
        for mode in MODES
    }
    gate = {}
    for budget in budgets:
        figures = fidelity(paired_answers(by_mode["original"][budget], by_mode["medtpe"][budget]))
        gate[str(budget)] = {
            "dtype": config.engine.dtype,
            "fidelity": figures,
            "failures": thresholds.check(figures),
            "records": [
                {mode: result.to_json() for mode, result in zip(MODES, pair, strict=True)}
                for pair in zip(
                    by_mode["original"][budget],
                    aligned(by_mode["original"][budget], by_mode["medtpe"][budget]),
                    strict=True,
                )
            ],
        }
    return gate
