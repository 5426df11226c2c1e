"""`vllm.LLM` offline on the exported default model, text prompt in: the MedTPE plugin (found
by its entry point, the model picked by its `medtpe.json`) encodes and decodes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from medtpe_core.tokenizer import MedTPETokenizer

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(900)]

PROMPT = "Heart Rate: 90 bpm\nNon Invasive Blood Pressure systolic: 110 mmHg\nThe patient"


def test_text_prompt_through_vllm_llm(
    service_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm import LLM, SamplingParams

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    export = service_files[1]
    medtpe = MedTPETokenizer.load(export)
    llm = LLM(model=str(export), max_model_len=2048, enforce_eager=True, seed=0)
    try:
        [output] = llm.generate(PROMPT, SamplingParams(max_tokens=16, temperature=0))
    finally:
        llm.llm_engine.engine_core.shutdown()
    ids = medtpe.encode(PROMPT, special_tokens=True)
    assert output.prompt_token_ids == ids
    assert len(ids) < len(medtpe.base_encode(PROMPT))
    [answer] = output.outputs
    assert answer.text and answer.text == medtpe.decode(answer.token_ids)
