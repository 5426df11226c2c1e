"""p_positive from the real default model: one short synthetic record through the evaluation path
(`run_modes` → `evaluate_mode` → `Predictor.answer` → vLLM first-token logprobs), medtpe mode."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from meds_fixtures import write_meds_dataset
from service_support import engine_test_config

from evaluation.records import load_records
from evaluation.report import build_report
from evaluation.runner import Sampling, run_modes
from medtpe_core.tasks import get_task

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(900)]


def test_p_positive_is_a_probability(
    service_files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    task = get_task("icu_mortality")
    meds = write_meds_dataset(tmp_path / "meds", subjects=(1,), hours=6)
    records = load_records(meds, meds / "labels" / "icu_mortality.parquet", task)

    config = engine_test_config(service_files, meds, max_new_tokens=8)
    results, _ = asyncio.run(run_modes([config], task, records, Sampling(max_new_tokens=8)))

    [record] = results["medtpe"]
    assert record.probabilities is not None, record.outputs
    assert set(record.probabilities) == {"yes", "no"}
    assert sum(record.probabilities.values()) == pytest.approx(1.0)
    assert record.p_positive == record.probabilities["yes"]
    assert 0.0 <= record.p_positive <= 1.0
    # the greedy first token is the top one: the answer's option has mass
    if record.prediction is True:
        assert record.p_positive > 0
    elif record.prediction is False:
        assert record.p_positive < 1
    report = build_report(task, results, settings={}, n_resamples=10)
    assert report["medtpe"]["p_positive_n"] == 1
    assert report["medtpe"]["auroc"] is None  # one record: one class only
