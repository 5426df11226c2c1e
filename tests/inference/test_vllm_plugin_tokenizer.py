"""The MedTPE tokenizer vLLM loads (`medtpe.inference.vllm_tokenizer`), without an engine: on the
committed default artefact (a directory with `medtpe.json`, the detokenizer `tokenizer.json`,
the tokenizer config and the chat template, as an export has them). Text in: MedTPE ids, as the
project's `MedTPETokenizer` gives them; ids out: lossless text, also through vLLM's own
incremental detokenizer; vLLM's registry picks it by mode and by detection."""

from __future__ import annotations

import copy
import itertools
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from vllm.sampling_params import SamplingParams
from vllm.tokenizers.hf import CachedHfTokenizer
from vllm.tokenizers.registry import get_tokenizer
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer, IncrementalDetokenizer

from medtpe.core.paths import default_artefact_dir
from medtpe.core.prompt import ChatTemplate
from medtpe.inference.vllm_plugin import register
from medtpe.inference.vllm_tokenizer import MedTPEEncoding, load_medtpe_tokenizer
from tests.support.properties import examples
from tests.support.tokenizer_support import EDGE_CASES, MIXED_TEXT

CLINICAL = "Non Invasive Blood Pressure: 120/80 mmHg\nHeart Rate: 88 bpm, température 😀 ✓"


@pytest.fixture(scope="module")
def medtpe_dir() -> Path:
    return default_artefact_dir()


@pytest.fixture(scope="module")
def tok(medtpe_dir: Path) -> Any:
    return load_medtpe_tokenizer(medtpe_dir, truncation_side="left")


def test_encodes_with_medtpe_and_compresses(tok: Any) -> None:
    text = "\n".join([CLINICAL] * 12)  # longer than the artefact's plain tail
    ids = tok.encode(text)
    assert ids == tok.medtpe.encode(text, special_tokens=True)
    assert len(ids) < len(tok.medtpe.base_encode(text))
    new_ids = {t.id for t in tok.medtpe.new_tokens}
    assert new_ids.intersection(ids), "no TPE token in a clinical text"
    assert tok.decode(ids) == text
    assert tok.tokenize(text) == tok.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("text", EDGE_CASES)
def test_edge_cases_round_trip(tok: Any, text: str) -> None:
    ids = tok.encode(text)
    assert ids == tok.medtpe.encode(text, special_tokens=True)
    assert tok.decode(ids) == text


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=MIXED_TEXT)
def test_round_trip_property(tok: Any, text: str) -> None:
    encoding = tok(text)
    ids = encoding["input_ids"]
    assert ids == tok.medtpe.encode(text, special_tokens=True)
    assert encoding["attention_mask"] == [1] * len(ids)
    assert tok.decode(ids) == tok.medtpe.decode(ids) == text
    assert all(0 <= i <= tok.max_token_id for i in ids)


def test_special_token_strings_are_parsed_as_vllm_parses_them(tok: Any) -> None:
    text = "<|im_start|>user\nhi<|im_end|>"
    ids = tok.encode(text)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert ids[-1] == tok.eos_token_id
    assert tok.num_special_tokens_to_add() == 0  # SmolLM2's post-processor adds nothing
    assert tok.encode(text, add_special_tokens=False) == ids


def test_truncation_keeps_the_side_vllm_asks_for(medtpe_dir: Path, tok: Any) -> None:
    ids = tok.encode(CLINICAL)
    assert tok(CLINICAL, truncation=True, max_length=5)["input_ids"] == ids[-5:]
    right = load_medtpe_tokenizer(medtpe_dir, truncation_side="right")
    assert right.encode(CLINICAL, truncation=True, max_length=5) == ids[:5]
    assert tok(CLINICAL, truncation=False, max_length=5)["input_ids"] == ids


def test_batch_of_texts(tok: Any) -> None:
    texts = [CLINICAL, "", "Heart Rate"]
    assert tok(texts)["input_ids"] == [tok.encode(t) for t in texts]


def test_offsets_cover_the_text(tok: Any) -> None:
    text = "Heart Rate: 88 bpm 😀 <|im_end|> élevée"
    encoding = tok(text, return_offsets_mapping=True)
    spans = encoding["offset_mapping"]
    assert len(spans) == len(encoding["input_ids"])
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    for (start, end), (next_start, _) in itertools.pairwise(spans):
        assert start <= end and next_start >= start and next_start <= end
    # tokens that hold whole characters span exactly their text
    for token_id, (start, end) in zip(encoding["input_ids"], spans, strict=True):
        piece = tok.decode([token_id])
        if "\ufffd" not in piece:
            assert text[start:end] == piece


def test_chat_template_renders_then_encodes_with_medtpe(medtpe_dir: Path, tok: Any) -> None:
    messages = [{"role": "user", "content": CLINICAL}]
    text = ChatTemplate.from_model_dir(medtpe_dir).render(messages, add_generation_prompt=True)
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert ids == tok.medtpe.encode(text, special_tokens=True)
    encoding = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert encoding["input_ids"] == ids
    assert (
        tok.apply_chat_template(
            messages, add_generation_prompt=True, return_dict=False, truncation=True, max_length=4
        )
        == ids[-4:]
    )


def test_text_pairs_are_refused(tok: Any) -> None:
    with pytest.raises(ValueError, match="text pairs"):
        tok("a", "b")


def test_copies_keep_medtpe(tok: Any) -> None:
    clone = copy.deepcopy(tok)  # vLLM's renderer pool deep-copies the tokenizer
    assert clone.medtpe is tok.medtpe
    assert clone.encode(CLINICAL) == tok.encode(CLINICAL)
    restored = pickle.loads(pickle.dumps(tok))
    assert isinstance(restored, MedTPEEncoding)
    assert restored.encode(CLINICAL) == tok.encode(CLINICAL)
    assert restored.truncation_side == "left"


def test_copies_read_nothing_from_disk(medtpe_dir: Path, tmp_path: Path) -> None:
    """vLLM's renderer copies the tokenizer and deep-copies it for its pool at every engine
    start: the copies are made in memory (a reload from disk took 9 s for a Qwen2.5-sized
    vocabulary), each deep copy with its own Rust tokenizer (the pool's thread safety)."""
    source = tmp_path / "export"
    shutil.copytree(medtpe_dir, source)
    tok = load_medtpe_tokenizer(source, truncation_side="left")
    shutil.rmtree(source)
    shallow, clone = copy.copy(tok), copy.deepcopy(tok)
    assert clone._tokenizer is not tok._tokenizer
    for copied in (shallow, clone):
        assert copied is not tok and copied.medtpe is tok.medtpe
        assert isinstance(copied, MedTPEEncoding) and copied.truncation_side == "left"
        assert copied.encode(CLINICAL) == tok.encode(CLINICAL)
        assert copied.decode(tok.encode(CLINICAL)) == tok.decode(tok.encode(CLINICAL))


def test_vllm_incremental_detokenizer_is_lossless(tok: Any) -> None:
    """vLLM's own detokenizer over answer ids one at a time: multi-byte characters split across
    tokens and TPE tokens spanning a space come out as the whole text."""
    prompt = tok.encode("<|im_start|>assistant\n")
    answer = tok.encode(CLINICAL)
    request = EngineCoreRequest(
        request_id="r",
        prompt_token_ids=prompt,
        mm_features=None,
        sampling_params=SamplingParams(max_tokens=len(answer)),
        pooling_params=None,
        arrival_time=0.0,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )
    detokenizer = IncrementalDetokenizer.from_new_request(tok, request)
    assert isinstance(detokenizer, FastIncrementalDetokenizer)
    deltas = []
    for token_id in answer:
        detokenizer.update([token_id], stop_terminated=False)
        deltas.append(detokenizer.get_next_output_text(finished=False, delta=True))
    assert "".join(deltas) == CLINICAL
    assert "" in deltas  # the emoji's first bytes wait for the rest


def test_registry_picks_medtpe_by_mode_and_by_detection(medtpe_dir: Path, tmp_path: Path) -> None:
    register()
    register()  # loaded once per vLLM process, possibly more: idempotent
    by_mode = get_tokenizer(str(medtpe_dir), tokenizer_mode="medtpe")
    detected = get_tokenizer(str(medtpe_dir))
    assert isinstance(by_mode, MedTPEEncoding) and isinstance(detected, MedTPEEncoding)
    assert detected.encode(CLINICAL) == by_mode.encode(CLINICAL)

    plain = tmp_path / "plain"  # the same files without medtpe.json: vLLM's own tokenizer
    plain.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(medtpe_dir / name, plain / name)
    stock = get_tokenizer(str(plain))
    assert not isinstance(stock, MedTPEEncoding)
    assert stock.encode(CLINICAL) == CachedHfTokenizer.from_pretrained(plain).encode(CLINICAL)
    with pytest.raises(FileNotFoundError, match=r"medtpe\.json"):
        get_tokenizer(str(plain), tokenizer_mode="medtpe")
