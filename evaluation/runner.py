"""Run the records through the service's engine and pipeline, one record at a time, one mode
per engine.

A record's latency is the service's path for one request with nothing else in flight: prompt
rendering within the budget, tokenization, generation, decoding and answer parsing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tqdm import tqdm

from evaluation.records import EvalRecord
from evaluation.results import RecordResult
from evaluation.setup import ModeSetup
from medtpe_core.tasks import Task
from medtpe_core.tasks.option_probabilities import positive_probability
from service.engine import GenerationEngine
from service.pipeline import Predictor


@dataclass(frozen=True)
class Sampling:
    """Generation settings shared by every mode of one evaluation."""

    n_samples: int = 1
    temperature: float = 0.0
    max_new_tokens: int = 64


async def evaluate_mode(
    engine: GenerationEngine,
    predictor: Predictor,
    task: Task,
    records: Sequence[EvalRecord],
    sampling: Sampling,
) -> list[RecordResult]:
    """Answer each record in turn (after one warm-up request) and time it; the answer options'
    probabilities come from the same request (first-token logprobs)."""
    await engine.warm_up(predictor.engine_ids(predictor.segment("Hello")))
    results = []
    for record in tqdm(records, desc=f"evaluate {predictor.mode}", unit="record"):
        start = time.perf_counter()
        prepared = predictor.prepare(task, record.events, record.prediction_time)
        answer = await predictor.answer(
            engine,
            prepared,
            n_samples=sampling.n_samples,
            temperature=sampling.temperature,
            max_new_tokens=sampling.max_new_tokens,
            probabilities=True,
        )
        latency = time.perf_counter() - start
        results.append(
            RecordResult(
                key=record.key,
                label=record.label,
                prediction=answer.prediction,
                format_ok=answer.format_ok,
                latency_s=latency,
                generate_s=answer.generate_s,
                n_tokens=len(prepared.engine_ids),
                n_tokens_original=len(prepared.segmentation.original_ids),
                load_avg_1m=os.getloadavg()[0],
                votes=[sample.prediction for sample in answer.samples],
                outputs=[sample.text for sample in answer.samples],
                probabilities=answer.probabilities,
                p_positive=positive_probability(task, answer.probabilities),
            )
        )
    return results


async def run_modes(
    setups: Sequence[Callable[[], ModeSetup]],
    task: Task,
    records: Sequence[EvalRecord],
    sampling: Sampling,
) -> tuple[dict[str, list[RecordResult]], list[ModeSetup]]:
    """Set up and evaluate each mode on its own engine, one after the other. A mode is set up
    (e.g. its checkpoint exported) only when its turn comes, and each engine is shut down before
    the next starts, so two never compete for memory or cores. Returns the results by mode and
    the set-ups used."""
    results, used = {}, []
    for make_setup in setups:
        setup = make_setup()
        used.append(setup)
        engine = GenerationEngine.start(setup.engine_config)
        try:
            results[setup.mode] = await evaluate_mode(
                engine, setup.predictor, task, records, sampling
            )
        finally:
            engine.shutdown()
    return results, used
