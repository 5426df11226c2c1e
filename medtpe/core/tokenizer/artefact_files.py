"""Artefact files: the detokenizer `tokenizer.json` (renamed vocabulary entries) and its inverse."""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from medtpe.core.tokenizer.base import BaseTokenizer, merge_pair

FORMAT_VERSION = 1
MEDTPE_FILE = "medtpe.json"
TOKENIZER_FILE = "tokenizer.json"
# copied next to the detokenizer when the base is a model directory
MODEL_TOKENIZER_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)


class ArtefactMismatchError(ValueError):
    """A MedTPE artefact was loaded onto a base tokenizer it was not built from."""


def _editable_model(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of a tokenizer.json object whose vocabulary and merge list (what the artefact
    edits) are its own; everything else is shared, read-only. Linear in the vocabulary at C
    speed, where a deep copy took seconds for a Qwen2.5-sized tokenizer."""
    model = dict(
        obj["model"], vocab=dict(obj["model"]["vocab"]), merges=list(obj["model"]["merges"])
    )
    return dict(obj, model=model)


def detokenizer_json(
    base: BaseTokenizer, renamed: Mapping[int, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The base tokenizer.json with vocabulary entries at `renamed` ids carrying new strings.

    Ids from the base vocabulary size up (an extension artefact's fresh ids) are appended as new
    entries. Base merges that mention a replaced string are dropped (in this file only: it serves
    decoding; MedTPE encoding always runs the untouched base). Also returns what `restore_base`
    needs to rebuild the base from it.
    """
    obj = _editable_model(base.json_obj)
    vocab: dict[str, int] = obj["model"]["vocab"]
    by_id = {i: s for s, i in vocab.items()}
    fresh = sorted(i for i in renamed if i >= base.vocab_size)
    old = {i: by_id[i] for i in renamed if i < base.vocab_size}
    gone = set(old.values())
    for i, new in renamed.items():
        if i in old:
            del vocab[old[i]]
        elif new in vocab:
            raise ValueError(f"fresh id {i}: {new!r} is already in the vocabulary")
        vocab[new] = i
    kept, removed = [], []
    for index, merge in enumerate(obj["model"]["merges"]):
        left, right = merge_pair(merge)
        if gone.intersection((left, right, left + right)):
            removed.append([index, merge])
        else:
            kept.append(merge)
    obj["model"]["merges"] = kept
    restore: dict[str, Any] = {
        "old_strings": {str(i): s for i, s in old.items()},
        "removed_merges": removed,
    }
    if fresh:  # absent for replacement artefacts: their medtpe.json stays as it was
        restore["fresh_ids"] = fresh
    return obj, restore


def restore_base(detok: dict[str, Any], restore: dict[str, Any]) -> dict[str, Any]:
    """Inverse of `detokenizer_json`: the base tokenizer.json content."""
    obj = _editable_model(detok)
    vocab: dict[str, int] = obj["model"]["vocab"]
    by_id = {i: s for s, i in vocab.items()}
    for i in restore.get("fresh_ids", ()):
        del vocab[by_id[i]]
    for key, s in restore["old_strings"].items():
        del vocab[by_id[int(key)]]
        vocab[s] = int(key)
    merges = obj["model"]["merges"]
    for index, merge in restore["removed_merges"]:
        merges.insert(index, merge)
    return obj


def check_base(base: BaseTokenizer, fingerprint: str, content_fingerprint: str) -> None:
    """Raise `ArtefactMismatchError` unless `base` is the tokenizer the artefact was built on."""
    if base.fingerprint != fingerprint and base.content_fingerprint != content_fingerprint:
        raise ArtefactMismatchError(
            f"this MedTPE artefact was built on base tokenizer {fingerprint[:12]}, "
            f"not on {base.fingerprint[:12]} ({base.path or 'in memory'})"
        )


def rebuild_base(
    detok: dict[str, Any], restore: dict[str, Any], base_info: dict[str, str]
) -> BaseTokenizer:
    """The base tokenizer rebuilt from an artefact's detokenizer, checked by fingerprint."""
    base = BaseTokenizer.from_json_obj(restore_base(detok, restore), base_info["fingerprint"])
    if base.content_fingerprint != base_info["content_fingerprint"]:
        raise ArtefactMismatchError("the artefact's tokenizer.json does not match its medtpe.json")
    return base


def copy_model_files(
    model_dir: Path | None, out: Path, names: Iterable[str] = MODEL_TOKENIZER_FILES
) -> None:
    """Copy the base model directory's tokenizer config and chat template files into `out`."""
    if model_dir is None:
        return
    for name in names:
        src, dst = model_dir / name, out / name
        if src.is_file() and src.resolve() != dst.resolve():
            shutil.copyfile(src, dst)
