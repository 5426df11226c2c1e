"""What a base model must bring to get a MedTPE artefact, checked before any work starts: a
Hugging Face causal LM checkpoint directory with a BPE `tokenizer.json`, a chat template and an
end-of-sequence token. Any architecture, tied or untied embeddings, any vocabulary size."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medtpe.core.prompt.chat_template import ChatTemplate, ChatTemplateError
from medtpe.core.tokenizer import BaseTokenizer
from medtpe.core.tokenizer.artefact_files import MEDTPE_FILE

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


class BaseModelError(ValueError):
    """The base model cannot take a MedTPE artefact (the message says why and where)."""


@dataclass(frozen=True)
class BaseModelInfo:
    """The facts of a base model a build relies on."""

    model_dir: Path
    model_type: str
    vocab_size: int
    tied_embeddings: bool
    eos_ids: tuple[int, ...]
    tokenizer_fingerprint: str


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


def eos_token_ids(model_dir: Path, tokenizer: BaseTokenizer) -> tuple[int, ...]:
    """The ids that end an answer: the generation config's `eos_token_id`, else the model
    config's, else the tokenizer config's `eos_token` (no model-specific string)."""
    for name in (GENERATION_CONFIG_FILE, CONFIG_FILE):
        ids = _ids(_json(model_dir / name).get("eos_token_id"))
        if ids:
            return ids
    token = _json(model_dir / TOKENIZER_CONFIG_FILE).get("eos_token")
    token = token.get("content") if isinstance(token, dict) else token
    found = tokenizer.tokenizer.token_to_id(token) if isinstance(token, str) else None
    return () if found is None else (found,)


def inspect_base_model(model_dir: Path) -> BaseModelInfo:
    """Check `model_dir` and return its facts; `BaseModelError` names what is missing."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_dir = Path(model_dir)
    config = _json(model_dir / CONFIG_FILE)
    if not config:
        raise BaseModelError(f"{model_dir}: no {CONFIG_FILE} (not a Hugging Face checkpoint)")
    model_type = config.get("model_type", "")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise BaseModelError(f"{model_dir}: model_type {model_type!r} is not a causal LM")
    if not (model_dir / "tokenizer.json").is_file():
        raise BaseModelError(f"{model_dir}: no tokenizer.json (MedTPE needs a fast BPE tokenizer)")
    try:
        tokenizer = BaseTokenizer.load(model_dir)
    except ValueError as exc:
        raise BaseModelError(f"{model_dir}/tokenizer.json: {exc}") from exc
    try:
        ChatTemplate.from_model_dir(model_dir)
    except ChatTemplateError as exc:
        raise BaseModelError(f"{exc} (MedTPE prompts are chat-templated)") from exc
    eos = eos_token_ids(model_dir, tokenizer)
    if not eos:
        raise BaseModelError(f"{model_dir}: no end-of-sequence token (eos_token_id or eos_token)")
    loaded = AutoConfig.from_pretrained(model_dir)
    vocab_size = int(loaded.get_text_config().vocab_size)
    if vocab_size < tokenizer.vocab_size:
        raise BaseModelError(
            f"{model_dir}: the tokenizer has {tokenizer.vocab_size} ids, the model {vocab_size}"
        )
    return BaseModelInfo(
        model_dir=model_dir,
        model_type=model_type,
        vocab_size=vocab_size,
        tied_embeddings=bool(getattr(loaded, "tie_word_embeddings", True)),
        eos_ids=eos,
        tokenizer_fingerprint=tokenizer.content_fingerprint,
    )


def check_artefact_base(artefact_dir: Path, info: BaseModelInfo) -> None:
    """`BaseModelError` if `artefact_dir` holds an artefact built on another base tokenizer."""
    path = Path(artefact_dir) / MEDTPE_FILE
    if not path.is_file():
        return
    base = json.loads(path.read_text()).get("base", {})
    if base.get("content_fingerprint") != info.tokenizer_fingerprint:
        raise BaseModelError(
            f"{artefact_dir} holds an artefact built on another base model's tokenizer than "
            f"{info.model_dir}: choose another output directory"
        )
