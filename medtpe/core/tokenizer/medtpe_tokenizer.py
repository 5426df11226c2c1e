"""`MedTPETokenizer`: base BPE, then evicted-token decomposition, then TPE pair merging.

Byte fallback: a byte-level base vocabulary may lack the symbol of some bytes (SmolLM2: 0x04 0x06
0x13 0x14 0x16 0x1D and the lead bytes 0xF1 0xF2 of U+40000..U+BFFFF); the base tokenizer drops
them. A build gives each such byte the id of one more evicted base token (`byte_fallback`), so
`decode(encode(s)) == s` for every string. Text with such a character is split there, the pieces
encoded as usual (batched) and the character spelled byte by byte: fallback ids for the missing
bytes, the base's byte-symbol tokens for the others (the continuation bytes of U+40000..U+BFFFF).

Plain tail: an artefact may leave the last `plain_tail` ids of every encoding unmerged (its
setting `PLAIN_TAIL`): a prompt then ends, up to its answer position, in the base model's own
tokens, where the answer's probability is read (docs/benchmarks.md, Fidelity). The ids before the
cut are merged as usual; no merge crosses it, so the encoding stays lossless.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from medtpe.core.tokenizer.artefact_files import (
    FORMAT_VERSION,
    MEDTPE_FILE,
    MODEL_TOKENIZER_FILES,
    TOKENIZER_FILE,
    check_base,
    copy_model_files,
    detokenizer_json,
    rebuild_base,
)
from medtpe.core.tokenizer.base import (
    MEMO_SIZE,
    BaseTokenizer,
    bytes_to_unicode,
    memoised,
    token_texts,
)
from medtpe.core.tokenizer.encoding import ByteFallback, IdExpansion, PairMerger

PLAIN_TAIL = "plain_tail"
"""The setting (`MedTPETokenizer.settings`) naming how many ids at the end of every encoding stay
unmerged (absent: 0)."""


@dataclass(frozen=True)
class NewToken:
    """A TPE token: its id (a reused one, or a fresh one in an extension artefact), its base
    constituents and its byte-level vocabulary string."""

    id: int
    constituents: tuple[int, ...]
    string: str


@dataclass
class _VocabularyTexts:
    """What one vocabulary's ids read as, shared by every tokenizer of that vocabulary in a
    process (`_vocabulary_texts`): each id's text, as decoded so far, and the byte-fallback
    decoder (built on first use: ~0.3 s for SmolLM2's)."""

    texts: dict[int, str] = field(default_factory=dict)
    byte_decoder: Tokenizer | None = None


_vocabularies: OrderedDict[str, _VocabularyTexts] = OrderedDict()
_vocabularies_lock = threading.Lock()


def _vocabulary_texts(key: str) -> _VocabularyTexts:
    """The shared `_VocabularyTexts` of the vocabulary `key` names, among the `MEMO_SIZE` most
    recently used: a service, a build or a test session loads the same artefact many times, and
    its stop rule reads every id's text (49,152 for SmolLM2) at each load."""
    with _vocabularies_lock:
        shared = _vocabularies.pop(key, None) or _VocabularyTexts()
        _vocabularies[key] = shared
        while len(_vocabularies) > MEMO_SIZE:
            _vocabularies.popitem(last=False)
        return shared


class MedTPETokenizer:
    """Lossless MedTPE tokenizer on top of an unmodified base tokenizer.

    `evicted` holds every evicted base id (new-token ids and byte-fallback ids) with its
    decomposition; `byte_fallback` maps a byte value to the evicted id that now spells it.
    An extension artefact (`medtpe.core.tokenizer.without_replacement`) evicts nothing: its new
    tokens and fallback bytes have fresh ids from the base vocabulary size up (`is_extension`).
    `vocab_size`: the ids the model needs (the base vocabulary size, or the largest fresh id + 1).
    `plain_tail`: the ids at the end of every encoding left unmerged (the setting `PLAIN_TAIL`,
    module docstring).
    """

    def __init__(
        self,
        base: BaseTokenizer,
        merges: Sequence[tuple[int, int, int]],
        evicted: dict[int, tuple[int, ...]],
        settings: dict[str, Any] | None = None,
        corpus_stats: dict[str, Any] | None = None,
        byte_fallback: dict[int, int] | None = None,
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
        self.byte_fallback = {int(b): int(i) for b, i in sorted((byte_fallback or {}).items())}
        fallback_ids = set(self.byte_fallback.values())
        if len(fallback_ids) != len(self.byte_fallback) or fallback_ids & parts.keys():
            raise ValueError("byte-fallback ids must be distinct and not new-token ids")
        if any(i < base.vocab_size and i not in self.evicted for i in fallback_ids):
            raise ValueError("byte-fallback ids must be evicted base ids or fresh ids")
        self.vocab_size = max(base.vocab_size, 1 + max([*parts, *fallback_ids], default=-1))
        size = self.vocab_size
        self._fallback = ByteFallback(self.byte_fallback, base.byte_ids()) if fallback_ids else None
        self._fallback_re = self._fallback.pattern if self._fallback else None
        self._is_fallback = np.zeros(size, dtype=bool)
        self._is_fallback[list(fallback_ids)] = True
        self._decompose = IdExpansion(self.evicted, size)
        self._merge = PairMerger(self.merges, size)
        self._to_base = IdExpansion(parts, size)
        self._pairs = {new: (left, right) for left, right, new in self.merges}
        self.plain_tail = self.settings.get(PLAIN_TAIL, 0)
        if not isinstance(self.plain_tail, int) or self.plain_tail < 0:
            raise ValueError(f"setting {PLAIN_TAIL!r}: expected an integer >= 0")
        self._shared = _vocabulary_texts(self._vocabulary_digest())

    def with_settings(self, **settings: Any) -> MedTPETokenizer:
        """This tokenizer with `settings` added to (or replacing) its own.

        >>> tok.with_settings(plain_tail=256).plain_tail  # doctest: +SKIP
        256
        """
        return MedTPETokenizer(
            self.base,
            self.merges,
            self.evicted,
            self.settings | settings,
            self.corpus_stats,
            self.byte_fallback,
        )

    @property
    def fingerprint(self) -> str:
        """sha256 of the base tokenizer.json."""
        return self.base.fingerprint

    @property
    def is_extension(self) -> bool:
        """Whether ids go beyond the base vocabulary (the "without replacement" variant)."""
        return self.vocab_size > self.base.vocab_size

    @property
    def artefact_id(self) -> str:
        """Short hash identifying this build (base, merges, evictions)."""
        parts: list[Any] = [self.fingerprint, self.merges, sorted(self.evicted.items())]
        if self.byte_fallback:  # absent from older builds: their ids stay the same
            parts.append(sorted(self.byte_fallback.items()))
        if self.plain_tail:  # absent from builds without one: their ids stay the same
            parts.append({PLAIN_TAIL: self.plain_tail})
        blob = json.dumps(parts)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def _vocabulary_digest(self) -> str:
        """sha256 of what every id reads as: the base's content, the merges, the evictions and
        the byte fallback."""
        parts = [
            self.base.content_fingerprint,
            self.merges,
            sorted(self.evicted.items()),
            sorted(self.byte_fallback.items()),
        ]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()

    def base_encode(self, text: str, special_tokens: bool = False) -> list[int]:
        """The unmodified base tokenizer's ids."""
        return self.base.encode(text, special_tokens)

    @property
    def fallback_ids(self) -> frozenset[int]:
        """The byte-fallback ids (empty for builds without byte fallback)."""
        return frozenset(self.byte_fallback.values())

    def needs_fallback(self, text: str) -> bool:
        """Whether `text` holds a character the base vocabulary cannot spell (a byte search per
        fallback byte)."""
        return self._fallback is not None and self._fallback.occurs_in(text)

    def encode(
        self, text: str, special_tokens: bool = False, plain_tail: int | None = None
    ) -> list[int]:
        """MedTPE ids of `text`, nothing added, lossless. Special-token look-alikes are plain text
        unless `special_tokens=True` (for a rendered chat template). `plain_tail`: the ids left
        unmerged at the end (None: the artefact's `self.plain_tail`; 0: merge everything).

        >>> tok.decode(tok.encode("Heart Rate: 80 bpm")) == "Heart Rate: 80 bpm"  # doctest: +SKIP
        True
        """
        if self.needs_fallback(text):
            return self._join(self._pieces([text], special_tokens)[0], plain_tail)
        return self.encode_ids(self.base.encode(text, special_tokens), plain_tail=plain_tail)

    def encode_batch(
        self, texts: Sequence[str], special_tokens: bool = False, plain_tail: int | None = None
    ) -> list[list[int]]:
        """`encode` over many texts; the base step runs in parallel."""
        if self._fallback_re is not None and any(map(self.needs_fallback, texts)):
            return [self._join(p, plain_tail) for p in self._pieces(texts, special_tokens)]
        encoded = self.base.encode_batch(texts, special_tokens)
        return [self.encode_ids(ids, plain_tail=plain_tail) for ids in encoded]

    def encode_parts(
        self, parts: Sequence[str | Sequence[int]], plain_tail: int | None = None
    ) -> list[int]:
        """MedTPE ids of the concatenation of `parts`, each plain text (`str`, special-token
        look-alikes included) or base ids; no merge crosses two parts, the plain tail is counted
        over the whole (a prompt of chat-template ids around a record's text)."""
        texts = iter(self._pieces([p for p in parts if isinstance(p, str)], special_tokens=False))
        pieces: list[tuple[np.ndarray, bool]] = []
        for part in parts:
            if isinstance(part, str):
                pieces += next(texts)
            else:
                pieces.append((self._decompose(np.array(part, dtype=np.int64)), True))
        return self._join(pieces, plain_tail)

    def _pieces(
        self, texts: Sequence[str], special_tokens: bool
    ) -> list[list[tuple[np.ndarray, bool]]]:
        """Each text unmerged, as (ids, mergeable) pieces: split at the runs of characters the
        base cannot spell, the pieces of every text base-encoded in one batch and split into
        their unevicted ids, the runs spelled byte by byte (never merged)."""
        if self._fallback is None or self._fallback_re is None:
            encoded = self.base.encode_batch(texts, special_tokens)
            return [[(self._decompose(np.array(ids, dtype=np.int64)), True)] for ids in encoded]
        splits = [self._fallback_re.split(t) for t in texts]  # text, run, text, ..., text
        flat = [piece for parts in splits for piece in parts[::2]]
        ids = iter(self.base.encode_batch(flat, special_tokens))
        return [
            [
                (np.array(self._fallback.ids(part), dtype=np.int64), False)
                if k % 2
                else (self._decompose(np.array(next(ids), dtype=np.int64)), True)
                for k, part in enumerate(parts)
            ]
            for parts in splits
        ]

    def _join(self, pieces: Sequence[tuple[np.ndarray, bool]], plain_tail: int | None) -> list[int]:
        """The pieces' ids in order, each mergeable piece merged up to the plain tail's cut (the
        last `plain_tail` ids of the whole, None: `self.plain_tail`); no merge crosses pieces."""
        tail = self.plain_tail if plain_tail is None else plain_tail
        before_cut = sum(len(ids) for ids, _ in pieces) - tail
        out: list[int] = []
        for ids, mergeable in pieces:
            n = min(max(before_cut, 0), len(ids))
            out += (self._merge(ids[:n]) if mergeable else ids[:n]).tolist() + ids[n:].tolist()
            before_cut -= len(ids)
        return out

    def encode_ids(
        self, base_ids: Sequence[int], merge: bool = True, plain_tail: int | None = None
    ) -> list[int]:
        """MedTPE ids from base ids (evicted tokens split, TPE pairs merged but over the last
        `plain_tail` ids, None: the artefact's; `merge=False`: only split, the text in the base
        model's own tokens). As lossy as the base ids: what the base tokenizer dropped is not
        recovered (use `encode` on the text); never yields byte-fallback ids."""
        arr = self._decompose(np.array(base_ids, dtype=np.int64))
        return self._join([(arr, True)], plain_tail) if merge else arr.tolist()

    def pair_of(self, token_id: int) -> tuple[int, int] | None:
        """The (left, right) ids a TPE token merges, each a base or an earlier TPE token; None
        for any other id.

        >>> tok.pair_of(tok.new_tokens[0].id)  # doctest: +SKIP
        (1023, 17)
        """
        return self._pairs.get(token_id)

    def to_base_ids(self, ids: Sequence[int], drop_fallback: bool = False) -> list[int]:
        """Base ids of MedTPE ids (new tokens replaced by their constituents). A byte-fallback id
        has no base equivalent: `ValueError`, or with `drop_fallback=True` it is left out (what
        the base tokenizer does with that byte)."""
        arr = np.array(ids, dtype=np.int64)
        if self._fallback is not None and arr.size and self._is_fallback[arr].any():
            if not drop_fallback:
                raise ValueError("byte-fallback ids have no base-tokenizer equivalent")
            arr = arr[~self._is_fallback[arr]]
        return self._to_base(arr).tolist()

    def shared_ends(
        self, ids: Sequence[int], base_ids: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Index pairs (i, j) where MedTPE `ids[: i + 1]` and base `base_ids[: j + 1]` spell the
        same text: every MedTPE token end that is also a base token end, the last pair included.
        `ids` must be `encode_ids(base_ids)` (`ValueError` when they spell different lengths).
        O(n): two cumulative sums of expansion lengths and one intersection.

        >>> i, j = tok.shared_ends(tok.encode_ids(base), base)  # doctest: +SKIP
        """
        ends, base_ends = self._text_ends(ids, base_ids)
        _, i, j = np.intersect1d(ends, base_ends, assume_unique=True, return_indices=True)
        return i, j

    def original_positions(self, ids: Sequence[int], base_ids: Sequence[int]) -> np.ndarray:
        """For each MedTPE id, the position in `base_ids` of the base token its text ends in
        (a merged token takes its last constituent's place; the parts of an evicted token share
        the evicted token's). `ids` must be `encode_ids(base_ids)`. O(n log n).

        >>> tok.original_positions(tok.encode_ids(base), base)[-1]  # doctest: +SKIP
        np.int64(41)
        """
        ends, base_ends = self._text_ends(ids, base_ids)
        return np.searchsorted(base_ends, ends)

    def _text_ends(
        self, ids: Sequence[int], base_ids: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Where each MedTPE id and each base id ends, in the finest tokens both spell;
        `ValueError` when the two spell different lengths."""
        ends = np.cumsum(self._to_base.lengths(np.asarray(ids, dtype=np.int64)))
        base_ends = np.cumsum(self._decompose.lengths(np.asarray(base_ids, dtype=np.int64)))
        if ends[-1:].tolist() != base_ends[-1:].tolist():
            raise ValueError("ids are not the MedTPE encoding of base_ids")
        return ends, base_ends

    def decode(self, ids: Sequence[int]) -> str:
        """Text of MedTPE ids (byte-fallback ids included)."""
        arr = np.array(ids, dtype=np.int64)
        base_ids = self._to_base(arr).tolist()  # byte-fallback ids are kept as they are
        if self._fallback is not None and arr.size and self._is_fallback[arr].any():
            return self._byte_decoder().decode(base_ids, skip_special_tokens=False)
        return self.base.decode(base_ids)

    def _byte_decoder(self) -> Tokenizer:
        """The base tokenizer with each byte-fallback id's vocabulary entry renamed to its byte's
        symbol (built on first use, once per vocabulary in a process)."""
        if self._shared.byte_decoder is None:
            obj, _ = detokenizer_json(self.base, self._fallback_strings())
            self._shared.byte_decoder = Tokenizer.from_str(json.dumps(obj))
        return self._shared.byte_decoder

    def _fallback_strings(self) -> dict[int, str]:
        symbol = bytes_to_unicode()
        return {i: symbol[b] for b, i in self.byte_fallback.items()}

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """Readable text of each token, for display (each id decoded once per vocabulary in a
        process)."""
        return token_texts(ids, self._shared.texts, self.decode_each)

    def decode_each(self, ids: Sequence[int]) -> list[str]:
        """`decode([i])` of each id, in one call: the base decodes every id's constituents at
        once; a byte-fallback id goes through `decode`."""
        arr = np.asarray(ids, dtype=np.int64)
        pieces = np.split(self._to_base(arr), np.cumsum(self._to_base.lengths(arr))[:-1])
        texts = self.base.decode_batch([piece.tolist() for piece in pieces])
        if self._fallback is not None:
            for k in np.flatnonzero(self._is_fallback[arr]).tolist():
                texts[k] = self.decode([int(arr[k])])
        return texts

    def save(self, path: str | Path) -> None:
        """Write the artefact (medtpe.json, detokenizer tokenizer.json, model tokenizer files);
        other files already in the directory are kept."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        detok, restore = detokenizer_json(
            self.base, {t.id: t.string for t in self.new_tokens} | self._fallback_strings()
        )
        doc = {
            "format_version": FORMAT_VERSION,
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
            "byte_fallback": {str(b): i for b, i in self.byte_fallback.items()},
            "detokenizer": restore,
        }
        (out / MEDTPE_FILE).write_text(json.dumps(doc, ensure_ascii=False, indent=1))
        (out / TOKENIZER_FILE).write_text(json.dumps(detok, ensure_ascii=False))
        copy_model_files(self.base.model_dir, out)

    @classmethod
    def load(
        cls, path: str | Path, base: str | Path | BaseTokenizer | None = None
    ) -> MedTPETokenizer:
        """Read an artefact directory. Without `base`, the base tokenizer is rebuilt from the
        artefact itself; with one, it must be the tokenizer the artefact was built on
        (`ArtefactMismatchError` otherwise)."""
        path = Path(path)
        doc = json.loads((path / MEDTPE_FILE).read_text())
        if doc.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unsupported MedTPE artefact format {doc.get('format_version')}")
        info = doc["base"]
        if base is None:
            base = _rebuilt_base(path, doc)
        elif not isinstance(base, BaseTokenizer):
            base = BaseTokenizer.load(base)
        check_base(base, info["fingerprint"], info["content_fingerprint"])
        return cls(
            base,
            [tuple(m) for m in doc["merges"]],
            {int(i): tuple(d) for i, d in doc["evicted"].items()},
            doc["settings"],
            doc["corpus_stats"],
            {int(b): int(i) for b, i in doc.get("byte_fallback", {}).items()},
        )


def _rebuilt_base(path: Path, doc: dict[str, Any]) -> BaseTokenizer:
    """The base tokenizer of the artefact at `path` (its `medtpe.json` read as `doc`), rebuilt
    from its detokenizer once per content in a process (`memoised`)."""
    raw = (path / TOKENIZER_FILE).read_bytes()
    restore = json.dumps(doc["detokenizer"], sort_keys=True).encode("utf-8")
    key = tuple(hashlib.sha256(part).hexdigest() for part in (raw, restore))

    base = memoised(
        ("artefact", *key),
        lambda: rebuild_base(json.loads(raw), doc["detokenizer"], doc["base"]),
    )
    model_dir = path if any((path / n).is_file() for n in MODEL_TOKENIZER_FILES) else None
    return base.at(None, model_dir)
