"""`vllm.LLM` offline on the exported default model (the committed default artefact), text
prompts in: the MedTPE plugin (found by its entry point, the model picked by its `medtpe.json`)
encodes and decodes them, and a general-text question gets the answer the same export gives its
MedTPE ids through the service's engine wrapper (greedy, the engine's own dtype). Not the base
model's: the export reads every prompt with its RoPE stretch (`medtpe/core/rope_stretch.py`), so
a question whose first answer token the base model nearly ties (this one: 0.08 nats between
"The" and "L'") may be answered otherwise (docs/serving.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from medtpe.core.prompt import ChatTemplate
from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.inference.cpu_dtype import engine_dtype
from medtpe.training.pseudo_labels import greedy_generate

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(900)]

PROMPT = (
    "".join(  # longer than the default artefact's plain tail (its last 256 ids unmerged)
        f"Heart Rate: {90 + m} bpm\nNon Invasive Blood Pressure systolic: {110 + m} mmHg\n"
        for m in range(16)
    )
    + "The patient"
)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_text_prompts_through_vllm_llm(
    service_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm import LLM, SamplingParams

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    export = service_files[1]
    medtpe = MedTPETokenizer.load(export)
    question = ChatTemplate.from_model_dir(export).render(QUESTION, add_generation_prompt=True)
    dtype = engine_dtype("auto")  # as the engine wrapper runs it (vLLM would take bfloat16)
    llm = LLM(model=str(export), max_model_len=2048, enforce_eager=True, seed=0, dtype=dtype)
    try:  # one prompt per call: each answer computed alone, as the reference's is
        [record] = llm.generate(PROMPT, SamplingParams(max_tokens=16, temperature=0))
        [answered] = llm.generate(question, SamplingParams(max_tokens=24, temperature=0))
    finally:
        llm.llm_engine.engine_core.shutdown()
    ids = medtpe.encode(PROMPT, special_tokens=True)
    assert record.prompt_token_ids == ids
    assert len(ids) < len(medtpe.base_encode(PROMPT))
    [answer] = record.outputs
    assert answer.text and answer.text == medtpe.decode(answer.token_ids)

    ids = medtpe.encode(question, special_tokens=True)
    assert answered.prompt_token_ids == ids
    assert len(ids) <= len(medtpe.base_encode(question, special_tokens=True))
    [reference] = greedy_generate(export, [ids], 24, max_model_len=256)
    [answer] = answered.outputs
    ended = answer.finish_reason == "stop"  # on the model's end id, which the wrapper drops
    assert list(answer.token_ids)[: -1 if ended else None] == reference
    assert answer.text.strip() and answer.text == medtpe.decode(reference)
