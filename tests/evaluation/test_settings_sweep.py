"""Several evaluation settings on one engine (`medtpe.evaluation.settings_sweep`): one engine for
the whole sweep, each setting at its own input budget, its results saved as soon as they exist,
the engine shut down also when a setting fails. The engine is the project's fake one; the
model, tokenizer and prompts are the real ones of the test artefact."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from medtpe.core.tasks import get_task
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.records import load_records
from medtpe.evaluation.settings_sweep import EvalSetting, evaluate_settings
from medtpe.inference.engines.instant import InstantEngine
from medtpe.inference.engines.protocol import EngineConfig, EngineFactory
from medtpe.inference.model import LoadedModel, load_model
from medtpe.inference.sampling import Sampling
from tests.support.meds_fixtures import write_meds_dataset
from tests.support.service_support import engine_test_config

MORTALITY = get_task("icu_mortality")


class CountedEngine(InstantEngine):
    """The fake engine, remembering whether it was shut down."""

    stopped = False

    def shutdown(self) -> None:
        self.stopped = True


def recording(engines: list[CountedEngine]) -> EngineFactory:
    """An engine factory that appends each engine it starts to `engines`."""

    def start(config: EngineConfig) -> CountedEngine:
        engines.append(CountedEngine(config.model_dir, config.max_model_len or 8192))
        return engines[-1]

    return start


@pytest.fixture
def model(service_files: tuple[Path, Path], tmp_path: Path) -> tuple[LoadedModel, Path]:
    meds = write_meds_dataset(tmp_path / "meds", subjects=(1, 2, 3), hours=30)
    return load_model(engine_test_config(service_files, meds, max_new_tokens=8)), meds


def test_settings_run_in_order_on_one_engine_at_their_budgets(
    model: tuple[LoadedModel, Path],
) -> None:
    loaded, meds = model
    records = load_records(meds, meds / "labels" / "icu_mortality.parquet", MORTALITY)
    greedy = Sampling(max_new_tokens=8)
    settings = [
        EvalSetting("budget-512", MORTALITY, records, greedy, max_input_tokens=512),
        EvalSetting("budget-200", MORTALITY, records[:2], greedy, max_input_tokens=200),
        EvalSetting("vote-3", MORTALITY, records[:1], Sampling(3, 0.7, 8)),
    ]
    engines: list[CountedEngine] = []
    saved: list[tuple[str, list[RecordResult]]] = []

    def save(setting: EvalSetting, rows: list[RecordResult]) -> None:
        saved.append((setting.name, rows))

    asyncio.run(evaluate_settings(loaded, settings, save, recording(engines)))

    assert len(engines) == 1 and engines[0].stopped
    assert [name for name, _ in saved] == ["budget-512", "budget-200", "vote-3"]
    by_name = dict(saved)
    assert [r.key for r in by_name["budget-512"]] == [r.key for r in records]
    assert all(r.original_tokens <= 512 for r in by_name["budget-512"])
    assert all(r.original_tokens <= 200 for r in by_name["budget-200"])
    assert by_name["budget-200"][0].original_tokens < by_name["budget-512"][0].original_tokens
    assert len(by_name["vote-3"][0].votes) == 3


def test_engine_is_shut_down_when_a_setting_fails(model: tuple[LoadedModel, Path]) -> None:
    loaded, meds = model
    records = load_records(meds, meds / "labels" / "icu_mortality.parquet", MORTALITY)

    def refuse(setting: EvalSetting, rows: list[RecordResult]) -> None:
        raise OSError("disk full")

    engines: list[CountedEngine] = []
    setting = EvalSetting("only", MORTALITY, records[:1], Sampling(max_new_tokens=8))
    with pytest.raises(OSError, match="disk full"):
        asyncio.run(evaluate_settings(loaded, [setting], refuse, recording(engines)))
    assert engines[0].stopped
