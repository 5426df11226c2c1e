"""Several evaluation settings on one engine: input budgets, decoding settings or task variants
evaluated in turn on the engine of one loaded model, so a sweep pays one engine start per mode.
Each setting's results go to `save` as soon as they exist, so an interrupted sweep keeps what
it finished."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from medtpe.core.tasks import Task
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.records import EvalRecord
from medtpe.evaluation.runner import evaluate_mode
from medtpe.inference.engines.factories import start_vllm
from medtpe.inference.engines.protocol import EngineFactory
from medtpe.inference.model import LoadedModel
from medtpe.inference.sampling import Sampling


@dataclass(frozen=True)
class EvalSetting:
    """One point of a sweep: which records of which task, how to sample, at which budget."""

    name: str
    task: Task
    records: Sequence[EvalRecord]
    sampling: Sampling
    max_input_tokens: int | None = None
    """Input budget in original tokens (`Predictor.at_budget`); None: the model's own."""


SaveResults = Callable[[EvalSetting, list[RecordResult]], None]


async def evaluate_settings(
    model: LoadedModel,
    settings: Iterable[EvalSetting],
    save: SaveResults,
    engine_factory: EngineFactory = start_vllm,
) -> None:
    """Evaluate every setting, in order, on one engine started for `model` (shut down at the
    end, also on error); `save(setting, results)` after each."""
    engine = engine_factory(model.engine_config)
    try:
        for setting in settings:
            predictor = model.predictor
            if setting.max_input_tokens is not None:
                predictor = predictor.at_budget(setting.max_input_tokens)
            results = await evaluate_mode(
                engine, predictor, setting.task, setting.records, setting.sampling
            )
            save(setting, results)
    finally:
        engine.shutdown()
