"""Constrained answers on the real vLLM engine with the default model in MedTPE mode: at
temperature 0.7, with and without the answer prefill, every sampled answer parses; with the
prefill, the option probabilities come from the masked first-token distribution."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from evaluation.records import load_records
from evaluation.runner import Sampling, evaluate_mode, measured
from inference.engines import start_vllm
from inference.model import load_model
from medtpe_core.tasks import get_task
from tests.support.meds_fixtures import write_meds_dataset
from tests.support.service_support import engine_test_config

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(1800)]

SAMPLING = Sampling(n_samples=2, temperature=0.7, max_new_tokens=32, constrained=True)
MORTALITY = get_task("icu_mortality")
CASES = (("icu_mortality", True), ("icu_mortality", False), ("phenotyping", True))
"""(task, answer prefill): a regex after the prefill, a JSON schema without it, a list answer."""


def test_constrained_answers_always_parse(
    service_files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    meds = write_meds_dataset(tmp_path / "meds", subjects=(1,), hours=6)
    config = engine_test_config(service_files, meds, max_new_tokens=SAMPLING.max_new_tokens)
    model = load_model(measured(config))
    task_records = load_records(meds, meds / "labels" / "icu_mortality.parquet", MORTALITY)

    async def run_all() -> None:  # one event loop for the engine's whole life
        engine = start_vllm(model.engine_config)
        try:
            for name, prefill in CASES:
                task = get_task(name).model_copy(update={"prefill_answer": prefill})
                # the fixture's mortality rows; phenotyping labels do not matter here
                records = [
                    r
                    if task.label_type == "binary"
                    else replace(r, point=replace(r.point, label=[]))
                    for r in task_records
                ]
                results = await evaluate_mode(engine, model.predictor, task, records, SAMPLING)
                for result in results:
                    parsed = [task.parse_answer(text) for text in result.outputs]
                    # strictly compliant: the answer object and nothing else
                    assert all(p.format_ok for p in parsed), (name, prefill, result.outputs)
                    assert result.format_ok
                    if task.label_type == "binary" and prefill:
                        assert result.probabilities is not None
                        assert sum(result.probabilities.values()) == pytest.approx(1.0)
        finally:
            engine.shutdown()

    asyncio.run(run_all())
