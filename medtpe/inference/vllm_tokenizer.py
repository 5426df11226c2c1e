"""MedTPE as a vLLM tokenizer: the export's own Hugging Face tokenizer with MedTPE encoding.

An exported checkpoint (`medtpe export`) holds `medtpe.json` and a `tokenizer.json` that decodes
MedTPE ids (the base vocabulary with the reused entries renamed). Loaded by a stock vLLM, that
file decodes correctly but encodes text without the TPE merges. `load_medtpe_tokenizer` takes
the tokenizer vLLM's `hf` mode would load and swaps in MedTPE for every path that turns text
into ids (`__call__`, `encode`, `tokenize`, `apply_chat_template(tokenize=True)`); everything
that starts from ids (decoding, vLLM's incremental `DecodeStream` detokenizer, logprob token
strings, the xgrammar vocabulary for structured outputs) stays the export's own tokenizer, which
is exactly MedTPE's vocabulary. Special-token strings in text are parsed as the stock tokenizer
parses them, and `add_special_tokens` adds what the base tokenizer's post-processor adds.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import BatchEncoding
from vllm.tokenizers.hf import CachedHfTokenizer, HfTokenizer
from vllm.tokenizers.protocol import TokenizerLike

from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.core.tokenizer.artefact_files import MEDTPE_FILE

TOKENIZER_MODE = "medtpe"
"""The `--tokenizer-mode` this plugin registers."""


def is_medtpe_dir(path: str | Path) -> bool:
    """Whether `path` is a local directory holding a MedTPE `medtpe.json`."""
    return (Path(path) / MEDTPE_FILE).is_file()


_CONSTRUCTION_TABLES = frozenset({"_vocab", "_merges"})
"""Attributes of a Hugging Face tokenizer class (e.g. Qwen2's) that only built its Rust
tokenizer: read-only afterwards, so copies share them."""


class _Shared:
    """Holds the MedTPE tokenizer; deep copies (vLLM's tokenizer pool) share it (stateless)."""

    def __init__(self, medtpe: MedTPETokenizer, source: Path, kwargs: dict[str, Any]) -> None:
        self.medtpe = medtpe
        self.source = source
        self.kwargs = kwargs
        ids = medtpe.base.tokenizer.encode("a", add_special_tokens=False).ids
        full = medtpe.base.tokenizer.encode("a", add_special_tokens=True).ids
        start = next(i for i in range(len(full)) if full[i : i + len(ids)] == ids)
        self.prefix, self.suffix = full[:start], full[start + len(ids) :]

    def __deepcopy__(self, memo: dict[int, Any]) -> _Shared:
        return self


class MedTPEEncoding:
    """Text-to-ids overrides mixed in front of the export's Hugging Face tokenizer class."""

    _medtpe_shared: _Shared
    truncation_side: str

    @property
    def medtpe(self) -> MedTPETokenizer:
        """The project's MedTPE tokenizer behind this one."""
        return self._medtpe_shared.medtpe

    def _medtpe_ids(
        self,
        text: str,
        add_special_tokens: bool,
        truncation: Any = None,
        max_length: int | None = None,
    ) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"MedTPE encodes text (str), not {type(text).__name__}")
        shared = self._medtpe_shared
        ids = shared.medtpe.encode(text, special_tokens=True)
        if add_special_tokens:
            ids = shared.prefix + ids + shared.suffix
        if truncation and max_length is not None and len(ids) > max_length:
            ids = (
                ids[len(ids) - max_length :] if self.truncation_side == "left" else ids[:max_length]
            )
        return ids

    def encode(
        self,
        text: str,
        text_pair: str | None = None,
        add_special_tokens: bool = True,
        truncation: Any = None,
        max_length: int | None = None,
        **kwargs: Any,
    ) -> list[int]:
        """MedTPE ids of `text` (special-token strings parsed, affixes added on request)."""
        _no_pair(text_pair)
        return self._medtpe_ids(text, add_special_tokens, truncation, max_length)

    def __call__(
        self,
        text: str | list[str],
        text_pair: str | None = None,
        add_special_tokens: bool = True,
        truncation: Any = None,
        max_length: int | None = None,
        return_offsets_mapping: bool = False,
        **kwargs: Any,
    ) -> BatchEncoding:
        """`input_ids` and `attention_mask` (and `offset_mapping` on request) of one text or a
        list of texts, MedTPE-encoded."""
        _no_pair(text_pair)
        texts = [text] if isinstance(text, str) else list(text)
        ids = [self._medtpe_ids(t, add_special_tokens, truncation, max_length) for t in texts]
        data: dict[str, Any] = {"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]}
        if return_offsets_mapping:
            data["offset_mapping"] = [self._offsets(t, i) for t, i in zip(texts, ids, strict=True)]
        if isinstance(text, str):
            data = {key: value[0] for key, value in data.items()}
        return BatchEncoding(data)

    def tokenize(self, text: str, pair: str | None = None, **kwargs: Any) -> list[str]:
        """Vocabulary strings of the MedTPE tokens of `text`."""
        _no_pair(pair)
        ids = self._medtpe_ids(text, bool(kwargs.get("add_special_tokens", False)))
        return self.convert_ids_to_tokens(ids)  # type: ignore[attr-defined,no-any-return]

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        """Ids `add_special_tokens=True` adds around one text."""
        _no_pair(pair or None)
        return len(self._medtpe_shared.prefix) + len(self._medtpe_shared.suffix)

    def apply_chat_template(
        self,
        conversation: Any,
        tools: Any = None,
        *,
        tokenize: bool = True,
        return_dict: bool = True,
        truncation: bool = False,
        max_length: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """The template rendered by the Hugging Face tokenizer; with `tokenize`, its MedTPE ids."""
        for unsupported in ("return_tensors", "return_assistant_tokens_mask", "padding"):
            if kwargs.pop(unsupported, None):
                raise ValueError(f"MedTPE tokenizer: {unsupported} is not supported")
        kwargs.pop("tokenizer_kwargs", None)
        rendered = super().apply_chat_template(  # type: ignore[misc]
            conversation, tools, tokenize=False, **kwargs
        )
        if not tokenize:
            return rendered
        texts = [rendered] if isinstance(rendered, str) else rendered
        ids = [self._medtpe_ids(t, False, truncation, max_length) for t in texts]
        out: Any = ids[0] if isinstance(rendered, str) else ids
        if not return_dict:
            return out
        mask = [[1] * len(i) for i in ids]
        return BatchEncoding(
            {"input_ids": out, "attention_mask": mask[0] if isinstance(rendered, str) else mask}
        )

    def _offsets(self, text: str, ids: Sequence[int]) -> list[tuple[int, int]]:
        """Character span of each token (byte-level vocabularies: one symbol per byte; a token
        that splits a character covers all of it; added tokens add (0, 0) when not in text)."""
        added = self.get_added_vocab()  # type: ignore[attr-defined]
        char_starts: list[int] = []  # byte offset where each character starts
        position = 0
        for char in text:
            char_starts.append(position)
            position += len(char.encode("utf-8"))
        spans, offset = [], 0
        prefix = len(self._medtpe_shared.prefix)
        body_end = len(ids) - len(self._medtpe_shared.suffix)
        for k, token in enumerate(self.convert_ids_to_tokens(list(ids))):  # type: ignore[attr-defined]
            if k < prefix or k >= body_end:
                spans.append((0, 0))
                continue
            length = len(token.encode("utf-8")) if token in added else len(token)
            start = bisect.bisect_right(char_starts, offset) - 1
            end = bisect.bisect_left(char_starts, offset + length)
            spans.append((max(start, 0), end))
            offset += length
        return spans

    def __copy__(self) -> MedTPEEncoding:
        # vLLM's renderer copies the tokenizer twice at every engine start: without this,
        # copy.copy goes through __reduce__, a reload from disk (9 s for Qwen2.5's vocabulary)
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def __deepcopy__(self, memo: dict[int, Any]) -> MedTPEEncoding:
        # each copy of vLLM's tokenizer pool gets its own Rust tokenizer; the construction
        # tables are shared (deep-copying Qwen2.5's took 7 s a copy)
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update(
            {
                k: v if k in _CONSTRUCTION_TABLES else copy.deepcopy(v, memo)
                for k, v in self.__dict__.items()
            }
        )
        return clone

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reload, (self._medtpe_shared.source, self._medtpe_shared.kwargs)


def _reload(source: Path, kwargs: dict[str, Any]) -> HfTokenizer:
    return load_medtpe_tokenizer(source, **kwargs)


def _no_pair(pair: object) -> None:
    if pair is not None:
        raise ValueError("MedTPE tokenizer: text pairs are not supported")


def load_medtpe_tokenizer(path: str | Path, *args: Any, **kwargs: Any) -> HfTokenizer:
    """The export directory's Hugging Face tokenizer, as vLLM loads it, encoding with MedTPE."""
    source = Path(path)
    if not is_medtpe_dir(source):
        raise FileNotFoundError(f"{source} holds no {MEDTPE_FILE}: not a MedTPE export")
    medtpe = MedTPETokenizer.load(source)
    hf = CachedHfTokenizer.from_pretrained(source, *args, **kwargs)
    if len(hf) < medtpe.vocab_size:
        raise ValueError(f"{source}: tokenizer.json has fewer ids than the MedTPE artefact")
    tokenizer = copy.copy(hf)
    base_cls = hf.__class__
    tokenizer.__class__ = type(f"MedTPE{base_cls.__name__}", (MedTPEEncoding, base_cls), {})
    tokenizer._medtpe_shared = _Shared(medtpe, source, kwargs)
    return tokenizer


class MedTPEVllmTokenizer(TokenizerLike):
    """`--tokenizer-mode medtpe`: the MedTPE tokenizer of an export directory."""

    @classmethod
    def from_pretrained(cls, path_or_repo_id: str | Path, *args: Any, **kwargs: Any) -> Any:
        return load_medtpe_tokenizer(path_or_repo_id, *args, **kwargs)


class MedTPEAutoTokenizer(TokenizerLike):
    """vLLM's `hf` (and `auto`) mode with MedTPE detection: a directory holding `medtpe.json`
    gets the MedTPE tokenizer, any other model exactly vLLM's own Hugging Face tokenizer."""

    @classmethod
    def from_pretrained(cls, path_or_repo_id: str | Path, *args: Any, **kwargs: Any) -> Any:
        if is_medtpe_dir(path_or_repo_id):
            return load_medtpe_tokenizer(path_or_repo_id, *args, **kwargs)
        return CachedHfTokenizer.from_pretrained(path_or_repo_id, *args, **kwargs)
