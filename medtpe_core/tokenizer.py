"""`MedTPETokenizer`: base BPE, then evicted-token decomposition, then TPE pair merging."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from medtpe_core import artefact
from medtpe_core.base_tokenizer import BaseTokenizer
from medtpe_core.encoding import IdExpansion, PairMerger


@dataclass(frozen=True)
class NewToken:
    """A TPE token: its (reused) id, its base constituents and its byte-level vocabulary string."""

    id: int
    constituents: tuple[int, ...]
    string: str


class MedTPETokenizer:
    """Lossless MedTPE tokenizer on top of an unmodified base tokenizer."""

    def __init__(
        self,
        base: BaseTokenizer,
        merges: Sequence[tuple[int, int, int]],
        evicted: dict[int, tuple[int, ...]],
        settings: dict[str, Any] | None = None,
        corpus_stats: dict[str, Any] | None = None,
    ) -> None:
        self.base = base
        self.merges = [tuple(m) for m in merges]
        self.evicted = dict(evicted)
        self.settings = dict(settings or {})
        self.corpus_stats = dict(corpus_stats or {})
        parts: dict[int, tuple[int, ...]] = {}
        for left, right, new in self.merges:
            parts[new] = parts.get(left, (left,)) + parts.get(right, (right,))
        self.new_tokens = [
            NewToken(i, c, "".join(base.id_to_token(j) or "" for j in c))
            for i, c in sorted(parts.items())
        ]
        size = base.vocab_size
        self._decompose = IdExpansion(self.evicted, size)
        self._merge = PairMerger(self.merges, size)
        self._to_base = IdExpansion(parts, size)

    @property
    def fingerprint(self) -> str:
        """sha256 of the base tokenizer.json."""
        return self.base.fingerprint

    @property
    def artefact_id(self) -> str:
        """Short hash identifying this build (base, merges, evictions)."""
        blob = json.dumps([self.fingerprint, self.merges, sorted(self.evicted.items())])
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def base_encode(self, text: str, special_tokens: bool = False) -> list[int]:
        """The unmodified base tokenizer's ids."""
        return self.base.encode(text, special_tokens)

    def encode(self, text: str, special_tokens: bool = False) -> list[int]:
        """MedTPE ids of `text`, nothing added. Special-token look-alikes are plain text unless
        `special_tokens=True` (for a rendered chat template)."""
        return self.encode_ids(self.base.encode(text, special_tokens))

    def encode_batch(self, texts: Sequence[str], special_tokens: bool = False) -> list[list[int]]:
        """`encode` over many texts; the base step runs in parallel."""
        return [self.encode_ids(ids) for ids in self.base.encode_batch(texts, special_tokens)]

    def encode_ids(self, base_ids: Sequence[int]) -> list[int]:
        """MedTPE ids from base ids (evicted tokens split, TPE pairs merged)."""
        arr = np.array(base_ids, dtype=np.int64)
        return self._merge(self._decompose(arr)).tolist()

    def to_base_ids(self, ids: Sequence[int]) -> list[int]:
        """Base ids of MedTPE ids (new tokens replaced by their constituents)."""
        return self._to_base(np.array(ids, dtype=np.int64)).tolist()

    def decode(self, ids: Sequence[int]) -> str:
        """Text of MedTPE ids."""
        return self.base.decode(self.to_base_ids(ids))

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """Readable text of each token, for display."""
        return [self.decode([i]) for i in ids]

    def save(self, path: str | Path) -> None:
        """Write the artefact (medtpe.json, detokenizer tokenizer.json, model tokenizer files);
        other files already in the directory are kept."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        detok, restore = artefact.detokenizer_json(
            self.base, {t.id: t.string for t in self.new_tokens}
        )
        doc = {
            "format_version": artefact.FORMAT_VERSION,
            "artefact_id": self.artefact_id,
            "base": {
                "fingerprint": self.base.fingerprint,
                "content_fingerprint": self.base.content_fingerprint,
                "vocab_size": self.base.vocab_size,
            },
            "settings": self.settings,
            "corpus_stats": self.corpus_stats,
            "merges": [list(m) for m in self.merges],
            "new_tokens": [
                {"id": t.id, "constituents": list(t.constituents), "string": t.string}
                for t in self.new_tokens
            ],
            "evicted": {str(i): list(d) for i, d in sorted(self.evicted.items())},
            "detokenizer": restore,
        }
        (out / artefact.MEDTPE_FILE).write_text(json.dumps(doc, ensure_ascii=False, indent=1))
        (out / artefact.TOKENIZER_FILE).write_text(json.dumps(detok, ensure_ascii=False))
        artefact.copy_model_files(self.base.model_dir, out)

    @classmethod
    def load(
        cls, path: str | Path, base: str | Path | BaseTokenizer | None = None
    ) -> MedTPETokenizer:
        """Read an artefact directory. Without `base`, the base tokenizer is rebuilt from the
        artefact itself; with one, it must be the tokenizer the artefact was built on
        (`ArtefactMismatchError` otherwise)."""
        path = Path(path)
        doc = json.loads((path / artefact.MEDTPE_FILE).read_text())
        if doc.get("format_version") != artefact.FORMAT_VERSION:
            raise ValueError(f"unsupported MedTPE artefact format {doc.get('format_version')}")
        info = doc["base"]
        if base is None:
            detok = json.loads((path / artefact.TOKENIZER_FILE).read_text())
            base = artefact.rebuild_base(detok, doc["detokenizer"], info)
            base.model_dir = (
                path if any((path / n).is_file() for n in artefact.MODEL_TOKENIZER_FILES) else None
            )
        elif not isinstance(base, BaseTokenizer):
            base = BaseTokenizer.load(base)
        artefact.check_base(base, info["fingerprint"], info["content_fingerprint"])
        return cls(
            base,
            [tuple(m) for m in doc["merges"]],
            {int(i): tuple(d) for i, d in doc["evicted"].items()},
            doc["settings"],
            doc["corpus_stats"],
        )
