"""Service parts that need no engine: settings, admission control, the prompt pipeline per mode,
majority voting, metrics exposition."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path

import pytest

from medtpe.core.meds import MedsEvent, SubjectEvents
from medtpe.core.prompt import ChatTemplate, PromptLayout
from medtpe.core.tasks import get_task
from medtpe.inference.predictor import (
    Answer,
    Predictor,
    Segmentation,
    default_prediction_time,
    majority_vote,
)
from medtpe.service.plumbing.limits import Admission, QueueFull
from medtpe.service.plumbing.metrics import ServiceMetrics
from medtpe.service.settings import ServiceSettings
from tests.support.service_support import synthetic_events
from tests.support.tokenizer_support import smollm2_dir, smollm2_medtpe


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDTPE_API_KEYS", " k1, k2 ,")
    monkeypatch.setenv("MEDTPE_MODE", "original")
    monkeypatch.setenv("MEDTPE_KV_CACHE_GIB", "none")
    monkeypatch.setenv("MEDTPE_MAX_CONCURRENCY", "3")
    settings = ServiceSettings()
    assert settings.api_keys == ["k1", "k2"]
    assert settings.mode == "original"
    assert settings.kv_cache_gib is None
    assert settings.capacity == 3 + settings.queue_limit
    monkeypatch.setenv("MEDTPE_MODE", "fast")
    with pytest.raises(ValueError, match="mode"):
        ServiceSettings()


def test_admission_counts_records_and_refuses_beyond_capacity() -> None:
    admission = Admission(max_concurrency=2, queue_limit=1)
    with admission.admit(2):
        with pytest.raises(QueueFull) as refused, admission.admit(2):
            pass
        assert refused.value.retry_after_s >= 1
        with admission.admit(1):
            assert admission.admitted == 3
    assert admission.admitted == 0


def test_admission_slots_bound_concurrency() -> None:
    admission = Admission(max_concurrency=2, queue_limit=10)
    running = peak = 0

    async def job() -> None:
        nonlocal running, peak
        async with admission.slot():
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1

    async def main() -> None:
        await asyncio.gather(*(job() for _ in range(8)))

    asyncio.run(main())
    assert peak == 2


@pytest.fixture(scope="module")
def events() -> SubjectEvents:
    return SubjectEvents.from_events([MedsEvent.model_validate(e) for e in synthetic_events(7, 80)])


@pytest.mark.parametrize("mode", ["medtpe", "original"])
def test_prepare_feeds_the_mode_s_ids(mode: str, events: SubjectEvents) -> None:
    tokenizer = smollm2_medtpe()
    predictor = Predictor(tokenizer, ChatTemplate.from_model_dir(smollm2_dir()), mode, 512)
    record = predictor.prepare(get_task("icu_mortality"), events, None)
    seg = record.segmentation
    assert len(seg.original_ids) == record.prompt.n_tokens_original <= 512
    assert seg.original_ids == tokenizer.base_encode(record.prompt.text, special_tokens=True)
    # record-first (the default): the head and record merged, the task's text left unmerged
    shared = seg.n_shared_original
    assert shared == len(record.prompt.head_ids) + len(record.prompt.record_ids)
    assert seg.medtpe_ids == tokenizer.encode_ids(seg.original_ids[:shared]) + (
        tokenizer.encode_ids(seg.original_ids[shared:], merge=False)
    )
    assert seg.medtpe_ids[: seg.n_shared_medtpe] == tokenizer.encode_ids(seg.original_ids[:shared])
    task_first = predictor.with_layout(PromptLayout.TASK_FIRST).prepare(
        get_task("icu_mortality"), events, None
    )
    assert task_first.segmentation.medtpe_ids == tokenizer.encode(
        task_first.prompt.text, special_tokens=True
    )
    assert len(seg.medtpe_ids) < len(seg.original_ids)
    assert record.ids(mode) == (seg.medtpe_ids if mode == "medtpe" else seg.original_ids)
    assert predictor.decode(record.ids(mode)) == record.prompt.text
    assert record.prediction_time == default_prediction_time(events)


def test_default_prediction_time_is_just_after_the_last_event() -> None:
    events = [
        MedsEvent(subject_id=1, time=None, code="GENDER//F"),
        MedsEvent(subject_id=1, time=datetime(2150, 1, 1, 8, 0, 30), code="A"),
        MedsEvent(subject_id=1, time=datetime(2150, 1, 1, 7, 0), code="B"),
    ]
    assert default_prediction_time(SubjectEvents.from_events(events)) == datetime(2150, 1, 1, 8, 1)
    assert default_prediction_time(SubjectEvents.from_events(events[:1])) is None


def test_majority_vote() -> None:
    assert majority_vote([True, False, False]) is False
    assert majority_vote([None, True]) is True
    assert majority_vote([["A"], ["B"]]) == ["A"]  # tie: first
    assert majority_vote([None]) is None


def test_metrics_exposition_names() -> None:
    metrics = ServiceMetrics()
    answer = Answer(True, True, [], generate_s=0.5, n_generated=3)
    metrics.observe_answer("icu_mortality", "medtpe", Segmentation([1] * 100, [2] * 60), answer)
    metrics.rejections.labels("queue_full").inc()
    text = metrics.render().decode()
    for name in (
        "medtpe_request_latency_seconds",
        "medtpe_generation_latency_seconds",
        "medtpe_prompt_tokens_total",
        "medtpe_prompt_tokens",
        "medtpe_compression_rate",
        "medtpe_format_compliance_total",
        "medtpe_inflight_requests",
        "medtpe_rejections_total",
        "medtpe_errors_total",
        "medtpe_engine_ready",
    ):
        assert f"# TYPE {name} " in text
    assert 'medtpe_prompt_tokens_total{task="icu_mortality",tokenizer="original"} 100.0' in text
    assert "_created" not in text


_OBSERVE_IN_A_PROCESS = """
from medtpe.inference.predictor import Answer, Segmentation
from medtpe.service.plumbing.metrics import ServiceMetrics
metrics = ServiceMetrics()
answer = Answer(True, True, [], generate_s=0.5, n_generated=3)
metrics.observe_answer("icu_mortality", "medtpe", Segmentation([1] * 100, [2] * 60), answer)
metrics.inflight.inc(2)
metrics.engine_ready.set(1)
"""


def test_multiprocess_exposition_sums_every_api_process(tmp_path: Path) -> None:
    """What `/metrics` of any API process reports with `MEDTPE_API_WORKERS` > 1: the values
    two real processes wrote, summed, each family once with its own type."""
    import os
    import subprocess
    import sys

    from medtpe.service.plumbing.metrics import MULTIPROCESS_DIR_ENV, multiprocess_exposition

    env = {**os.environ, MULTIPROCESS_DIR_ENV: str(tmp_path)}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", _OBSERVE_IN_A_PROCESS], env=env, check=True)
    text = multiprocess_exposition(tmp_path).decode()
    assert "# TYPE medtpe_prompt_tokens_total counter" in text
    assert "# TYPE medtpe_prompt_tokens histogram" in text
    assert 'medtpe_prompt_tokens_total{task="icu_mortality",tokenizer="original"} 200.0' in text
    assert 'medtpe_prompt_tokens_count{task="icu_mortality",tokenizer="medtpe"} 2.0' in text
    assert 'medtpe_format_compliance_total{result="ok",task="icu_mortality"} 2.0' in text
    assert "medtpe_inflight_requests 4.0" in text  # livesum: the writers' pids are not checked
    assert len([line for line in text.splitlines() if line.startswith("medtpe_engine_ready{")]) == 2


def test_api_processes_share_the_admission_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDTPE_API_WORKERS", "3")
    monkeypatch.setenv("MEDTPE_MAX_CONCURRENCY", "16")
    monkeypatch.setenv("MEDTPE_QUEUE_LIMIT", "64")
    settings = ServiceSettings()
    assert settings.process_limits == (6, 22)
    assert settings.capacity == 28
    assert settings.model().engine.max_num_seqs == 16  # the one engine batches for all three
    monkeypatch.setenv("MEDTPE_API_WORKERS", "0")
    with pytest.raises(ValueError, match="api_workers"):
        ServiceSettings()


def test_parallel_settings_reach_the_engine_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    from medtpe.inference.engines.protocol import EngineConfig
    from medtpe.inference.engines.vllm_engine import engine_args

    monkeypatch.setenv("MEDTPE_TENSOR_PARALLEL_SIZE", "4")
    monkeypatch.setenv("MEDTPE_PIPELINE_PARALLEL_SIZE", "2")
    monkeypatch.setenv("MEDTPE_DISTRIBUTED_EXECUTOR_BACKEND", "ray")
    monkeypatch.setenv("MEDTPE_MAX_CONCURRENCY", "7")
    options = ServiceSettings().model().engine
    args = engine_args(EngineConfig(Path("/models/x"), 4096, options))
    assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (4, 2)
    assert args.distributed_executor_backend == "ray"
    assert args.max_num_seqs == 7 and args.max_model_len == 4096
    assert args.disable_log_stats is False
    monkeypatch.setenv("MEDTPE_DISTRIBUTED_EXECUTOR_BACKEND", "none")
    assert ServiceSettings().model().engine.distributed_executor_backend is None
    monkeypatch.setenv("MEDTPE_DISTRIBUTED_EXECUTOR_BACKEND", "carrier-pigeon")
    with pytest.raises(ValueError, match="distributed_executor_backend"):
        ServiceSettings()
