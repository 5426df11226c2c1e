"""The real vLLM engine behind `medtpe.inference.engines.protocol.Engine`, medtpe mode on the
default model, one engine for the module (one start): the dtype it reports (the one asked for,
resolved); constrained answers at temperature 0.7, with and without the answer prefill, every
sampled answer parsing; a prompt sharing an earlier one's start served from the prefix cache;
p_yes from one short synthetic record through
the evaluation path (`evaluate_mode` -> `Predictor.answer` -> first-token logprobs); the model
computed in the engine core, on every allowed core; then its engine process is killed and the
engine must report death and refuse to generate (what the service maps to 503 and red
readiness): that test runs last.

Beside it, stock `vllm.LLM` offline on the same export, text prompts in: the MedTPE plugin
(found by its entry point, the model picked by its `medtpe.json`) encodes and decodes them, and
a general-text question gets the answer the module's engine (the service's wrapper) gives its
MedTPE ids, greedy, in the same dtype. Not the base model's answer: the export reads every
prompt with its RoPE stretch (`medtpe/core/rope_stretch.py`), so a question whose first answer
token the base model nearly ties may be answered otherwise (docs/serving.md)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import pytest

from medtpe.core.prompt import ChatTemplate
from medtpe.core.tasks import Task, get_task
from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.evaluation.figures import build_report
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.records import EvalRecord, load_records
from medtpe.evaluation.runner import evaluate_mode
from medtpe.inference.cpu_cores import SMALL_MACHINE_CORES
from medtpe.inference.cpu_dtype import engine_dtype
from medtpe.inference.engines.instant import PrefixCache
from medtpe.inference.engines.protocol import EngineDead, Finish, GenerationParams
from medtpe.inference.engines.vllm_engine import VllmEngine
from medtpe.inference.model import load_model
from medtpe.inference.predictor import Predictor
from medtpe.inference.sampling import Sampling
from tests.support.meds_fixtures import write_meds_dataset
from tests.support.service_support import ENGINE_DTYPE, engine_test_config

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(900)]

MORTALITY = get_task("icu_mortality")
SAMPLING = Sampling(n_samples=2, temperature=0.7, max_new_tokens=32, constrained=True)
CASES = (("icu_mortality", True), ("icu_mortality", False), ("phenotyping", True))
"""(task, answer prefill): a regex after the prefill, a JSON schema without it, a list answer."""
PLAIN_PROMPT = (
    "".join(  # longer than the default artefact's plain tail (its last 128 ids unmerged)
        f"Heart Rate: {90 + m} bpm\nNon Invasive Blood Pressure systolic: {110 + m} mmHg\n"
        for m in range(16)
    )
    + "The patient"
)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@dataclass(frozen=True)
class EngineRun:
    """The module's engine, its model and records, and the one event loop the engine lives in
    (its output loop is a task of that loop)."""

    engine: VllmEngine
    predictor: Predictor
    records: list[EvalRecord]
    loop: asyncio.AbstractEventLoop


@pytest.fixture(scope="module")
def run(
    service_files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineRun]:
    """One engine for the module: the test artefact, a 1 GiB KV cache, eager, 32 answer tokens
    at most, prefix caching on as in the service (`measured` would turn it off); one synthetic
    ICU record."""
    meds = write_meds_dataset(tmp_path_factory.mktemp("meds") / "meds", subjects=(1,), hours=6)
    records = load_records(meds, meds / "labels" / "icu_mortality.parquet", MORTALITY)
    model = load_model(engine_test_config(service_files, meds, SAMPLING.max_new_tokens))
    loop = asyncio.new_event_loop()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        engine = VllmEngine.start(model.engine_config)
    try:
        yield EngineRun(engine, model.predictor, records, loop)
    finally:
        engine.shutdown()
        loop.close()


def test_constrained_answers_always_parse(run: EngineRun) -> None:
    # the dtype it reports (receipts name it) is the one asked for, resolved, never auto
    assert run.engine.dtype == engine_dtype(run.engine.config.options.dtype) == ENGINE_DTYPE
    assert run.engine.dtype != "auto"
    for name, prefill in CASES:
        task = get_task(name).model_copy(update={"prefill_answer": prefill})
        # the fixture's mortality rows; phenotyping labels do not matter here
        records = [
            r if task.label_type == "binary" else replace(r, point=replace(r.point, label=[]))
            for r in run.records
        ]
        results = run.loop.run_until_complete(
            evaluate_mode(run.engine, run.predictor, task, records, SAMPLING)
        )
        for result in results:
            parsed = [task.parse_answer(text) for text in result.outputs]
            # strictly compliant: the answer object and nothing else
            assert all(p.format_ok for p in parsed), (name, prefill, result.outputs)
            assert result.format_ok
            if task.label_type == "binary" and prefill:
                assert result.probabilities is not None
                assert sum(result.probabilities.values()) == pytest.approx(1.0)


def test_a_shared_prefix_is_served_from_the_cache(run: EngineRun) -> None:
    """Two prompts sharing a start under one cache salt: the second reuses the first's full
    blocks (vLLM's `num_cached_tokens`), as many as the instant engine's `PrefixCache` reports
    for the same prompts; the salt is this test's own, so the first finds nothing."""
    prefix = run.predictor.engine_ids(run.predictor.segment(" ".join(["heart rate 92"] * 60)))
    tails = [run.predictor.engine_ids(run.predictor.segment(f" Question {k}?")) for k in (1, 2)]
    prompts = [prefix + tail for tail in tails]
    params = GenerationParams(max_new_tokens=2, cache_salt="shared-prefix-test")
    cached = [
        run.loop.run_until_complete(run.engine.generate(prompt, params))[0].cached_tokens
        for prompt in prompts
    ]
    model = PrefixCache()
    assert cached == [model.admit(prompt, params.cache_salt) for prompt in prompts]
    assert cached[0] == 0 < cached[1] <= len(prefix)


def test_text_prompts_through_vllm_llm(
    run: EngineRun, service_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stock `vllm.LLM` on the module engine's export, then shut down (its engine core is gone
    before the last test kills the module's)."""
    from vllm import LLM, SamplingParams

    export = service_files[1]
    assert run.engine.config.model_dir == export
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    medtpe = MedTPETokenizer.load(export)
    question = ChatTemplate.from_model_dir(export).render(QUESTION, add_generation_prompt=True)
    llm = LLM(
        model=str(export), max_model_len=2048, enforce_eager=True, seed=0, dtype=run.engine.dtype
    )
    try:  # one prompt per call: each answer computed alone, as the reference's is
        [record] = llm.generate(PLAIN_PROMPT, SamplingParams(max_tokens=16, temperature=0))
        [answered] = llm.generate(question, SamplingParams(max_tokens=24, temperature=0))
    finally:
        llm.llm_engine.engine_core.shutdown()
    ids = medtpe.encode(PLAIN_PROMPT, special_tokens=True)
    assert record.prompt_token_ids == ids
    assert len(ids) < len(medtpe.base_encode(PLAIN_PROMPT))
    [answer] = record.outputs
    assert answer.text and answer.text == medtpe.decode(answer.token_ids)

    ids = medtpe.encode(question, special_tokens=True)
    assert answered.prompt_token_ids == ids
    assert len(ids) <= len(medtpe.base_encode(question, special_tokens=True))
    params = GenerationParams(max_new_tokens=24, cache_salt="vllm-llm-reference")
    [reference] = run.loop.run_until_complete(run.engine.generate(ids, params))
    [answer] = answered.outputs
    ended = answer.finish_reason == "stop"  # on the model's end id, which the wrapper drops
    assert list(answer.token_ids)[: -1 if ended else None] == reference.ids
    assert answer.text.strip() and answer.text == medtpe.decode(reference.ids)


def test_p_yes_is_a_probability(run: EngineRun) -> None:
    """Runs last: it kills the module's engine."""
    task = MORTALITY
    rows = run.loop.run_until_complete(
        evaluate_then_kill(run.engine, run.predictor, task, run.records)
    )
    results = {"medtpe": rows}

    [record] = results["medtpe"]
    assert record.probabilities is not None, record.outputs
    assert set(record.probabilities) == {"yes", "no"}
    assert sum(record.probabilities.values()) == pytest.approx(1.0)
    assert record.p_yes == record.probabilities["yes"]
    assert 0.0 <= record.p_yes <= 1.0
    # the greedy first token is the top one: the answer's option has mass
    if record.prediction is True:
        assert record.p_yes > 0
    elif record.prediction is False:
        assert record.p_yes < 1
    report = build_report(task, results, settings={}, n_resamples=10)
    assert report.medtpe.p_yes_n == 1
    assert report.medtpe.auroc.value is None  # one record: one class only


async def stop_rule_ends_the_answer(
    engine: VllmEngine, predictor: Predictor, task: Task, record: EvalRecord
) -> None:
    """The stop rule inside the engine: with `stop_ids` the answer is the free answer cut right
    after its first stop id (kept), and says it stopped there."""
    prepared = predictor.prepare(task, record.events, record.prediction_time)
    free_params = GenerationParams(max_new_tokens=16)
    [free] = await engine.generate(prepared.ids(predictor.mode), free_params)
    stopping = replace(free_params, stop_ids=predictor.stop_ids)
    [stopped] = await engine.generate(prepared.ids(predictor.mode), stopping)
    first = next(k for k, token in enumerate(free.ids) if token in predictor.stop_ids)
    assert stopped.ids == free.ids[: first + 1] and stopped.finish is Finish.STOP
    assert free.finish is not Finish.STOP
    parsed = task.parse_answer(prepared.prompt.response_prefix + predictor.decode(stopped.ids))
    assert parsed.format_ok and parsed.trailing == ""


async def evaluate_then_kill(
    engine: VllmEngine, predictor: Predictor, task: Task, records: list[EvalRecord]
) -> list[RecordResult]:
    """Evaluate the records, then kill the engine core processes: the engine must turn dead and
    raise `EngineDead` (one event loop: the engine's output loop lives in it)."""
    rows = await evaluate_mode(engine, predictor, task, records, Sampling(max_new_tokens=8))
    await stop_rule_ends_the_answer(engine, predictor, task, records[0])
    prompt_ids = predictor.engine_ids(predictor.segment("Hi"))
    # this engine's core is a child of this process; services that other tests of the session
    # keep running have their cores one level further down, and must live on
    cores = [
        child
        for child in psutil.Process().children()
        if "EngineCore" in " ".join(child.cmdline() or [child.name()])
    ]
    assert cores, "no engine core process found"
    assert_computes_on_every_core(cores)
    assert not engine.dead
    for core in cores:
        core.kill()
    with pytest.raises(EngineDead):
        await engine.generate(prompt_ids, GenerationParams(max_new_tokens=2))
    assert engine.dead
    return rows


def assert_computes_on_every_core(cores: list[psutil.Process]) -> None:
    """On a machine of at most `SMALL_MACHINE_CORES` cores, the engine computes the model in
    its core process (no worker process of its own: one import of torch and vLLM fewer at each
    start) and may run on every core this process may: vLLM's own binding put its worker on all
    but one, so two engines on 2 cores both ran on core 0."""
    allowed = os.sched_getaffinity(0)
    if len(allowed) > SMALL_MACHINE_CORES:  # vLLM's own reservation applies there
        return
    for core in cores:
        titles = [" ".join(p.cmdline() or [p.name()]) for p in core.children(recursive=True)]
        assert not any("Worker" in title for title in titles), titles  # vLLM's VLLM::Worker
        # the main thread is the OpenMP master thread, bound to the engine's cores
        assert os.sched_getaffinity(core.pid) == allowed, core.environ().get("OMP_PLACES")
