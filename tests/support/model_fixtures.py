"""Tiny Hugging Face checkpoints (random weights) on the real tokenizers of tests/fixtures:
SmolLM2's family (Llama, tied embeddings) and Qwen2.5's (Qwen2, untied output head)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from tests.support.paths import FIXTURES

if TYPE_CHECKING:
    from transformers import PreTrainedModel

SMOLLM2_TOKENIZER = FIXTURES / "tokenizers" / "smollm2" / "tokenizer.json.gz"
SMOLLM2_CONFIG = FIXTURES / "smollm2" / "tokenizer_config.json"
QWEN25_TOKENIZER = FIXTURES / "tokenizers" / "qwen2.5" / "tokenizer.json.gz"
QWEN25_CONFIG = FIXTURES / "tokenizers" / "qwen2.5" / "tokenizer_config.json"
QWEN25_VOCAB_SIZE = 151936  # Qwen2.5's embedding rows (more than its 151,646 tokenizer ids)


def _tokenizer_files(out: Path, tokenizer_gz: Path, tokenizer_config: Path) -> int:
    """Unpack tokenizer.json, copy tokenizer_config.json; the eos token's id."""
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(tokenizer_gz, "rb") as src, (out / "tokenizer.json").open("wb") as dst:
        shutil.copyfileobj(src, dst)
    shutil.copyfile(tokenizer_config, out / "tokenizer_config.json")
    eos = json.loads(tokenizer_config.read_text())["eos_token"]
    added = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
    return next(t["id"] for t in added if t["content"] == eos)


def tiny_llama_model(tie: bool = True, eos_token_id: int | None = None) -> PreTrainedModel:
    """A 2-layer Llama (hidden 16, SmolLM2's 49,152 ids), seeded random weights."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=tie,
        eos_token_id=eos_token_id,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def tiny_llama(out: Path, tie: bool = True) -> Path:
    """`tiny_llama_model` saved with SmolLM2's tokenizer and chat template."""
    eos = _tokenizer_files(out, SMOLLM2_TOKENIZER, SMOLLM2_CONFIG)
    tiny_llama_model(tie, eos).save_pretrained(out)
    return out


def tiny_qwen2(out: Path) -> Path:
    """A 2-layer Qwen2 (hidden 128, head dim 64) with an untied output head, Qwen2.5's 151,936
    embedding rows and the real Qwen2.5 tokenizer and chat template. The head's rows past the
    tokenizer's ids are zero, so greedy decoding (random weights) picks real tokens."""
    import torch
    import transformers

    eos = _tokenizer_files(out, QWEN25_TOKENIZER, QWEN25_CONFIG)
    config = transformers.Qwen2Config(
        vocab_size=QWEN25_VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=eos,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    n_ids = Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    with torch.no_grad():
        model.lm_head.weight[n_ids:] = 0.0
    model.generation_config = transformers.GenerationConfig(eos_token_id=eos)
    model.save_pretrained(out)
    return out
