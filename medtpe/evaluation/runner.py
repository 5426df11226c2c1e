"""Run the records through the service's engine and pipeline, one record at a time, one mode
per engine.

A record's latency is the service's path for one request with nothing else in flight: prompt
rendering within the budget, tokenization, generation, decoding and answer parsing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import replace

from tqdm import tqdm

from medtpe.core.tasks import Task
from medtpe.core.tasks.option_probabilities import positive_probability
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.records import EvalRecord
from medtpe.inference.engines.factories import start_vllm
from medtpe.inference.engines.protocol import Engine, EngineFactory
from medtpe.inference.model import LoadedModel, ModelConfig, load_model
from medtpe.inference.predictor import Predictor
from medtpe.inference.record import MedsRecord
from medtpe.inference.sampling import Sampling


async def evaluate_mode(
    engine: Engine,
    predictor: Predictor,
    task: Task,
    records: Sequence[EvalRecord],
    sampling: Sampling,
) -> list[RecordResult]:
    """Answer each record in turn (after one warm-up request), through the record object every
    door prepares (`medtpe.inference.record.MedsRecord`), and time it; the answer options'
    probabilities come from the same request (first-token logprobs, with
    `sampling.probabilities`)."""
    await engine.warm_up(predictor.engine_ids(predictor.segment("Hello")))
    results = []
    for record in tqdm(records, desc=f"evaluate {predictor.mode}", unit="record"):
        start = time.perf_counter()
        prepared = MedsRecord(record.events, record.prediction_time).prepare(predictor, task)
        answer = await predictor.answer(engine, prepared, sampling)
        latency = time.perf_counter() - start
        results.append(
            RecordResult(
                key=record.key,
                label=record.label,
                prediction=answer.prediction,
                format_ok=answer.format_ok,
                latency_s=latency,
                generate_s=answer.generate_s,
                n_tokens=len(prepared.ids(predictor.mode)),
                original_tokens=len(prepared.segmentation.original_ids),
                load_avg_1m=os.getloadavg()[0],
                votes=[sample.prediction for sample in answer.samples],
                outputs=[sample.text for sample in answer.samples],
                probabilities=answer.probabilities,
                p_yes=positive_probability(task, answer.probabilities),
                finishes=[str(sample.finish) for sample in answer.samples],
                trailing=[sample.trailing for sample in answer.samples],
                n_generated=answer.n_generated,
            )
        )
    return results


def measured(config: ModelConfig) -> ModelConfig:
    """`config` with automatic prefix caching off, so that every record pays its full prefill,
    as a first request would."""
    return replace(config, engine=replace(config.engine, enable_prefix_caching=False))


async def run_modes(
    configs: Sequence[ModelConfig],
    task: Task,
    records: Sequence[EvalRecord],
    sampling: Sampling,
    engine_factory: EngineFactory = start_vllm,
) -> tuple[dict[str, list[RecordResult]], list[LoadedModel]]:
    """Load and evaluate each mode on its own engine, one after the other (prefix caching off).
    A mode is loaded only when its turn comes (its files prepared beforehand, e.g. by
    `medtpe.training.export.prepare_model_files`), and each engine is shut down before the next
    starts, so two never compete for memory or cores. Returns the results by mode and the models
    used."""
    results, used = {}, []
    for config in configs:
        model = load_model(measured(config))
        used.append(model)
        engine = engine_factory(model.engine_config)
        try:
            results[config.mode] = await evaluate_mode(
                engine, model.predictor, task, records, sampling
            )
        finally:
            engine.shutdown()
    return results, used
