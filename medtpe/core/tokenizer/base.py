"""The unmodified base tokenizer (a Hugging Face `tokenizer.json` with a BPE model)."""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer


def canonical_fingerprint(obj: dict[str, Any]) -> str:
    """sha256 of a tokenizer.json's parsed content, independent of its formatting."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level map: byte value -> the printable character that stands for it."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    for n, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(256 + n)
    return table


MEMO_SIZE = 4
"""Base tokenizers a process keeps parsed (`memoised`): a build, a service or a test session
loads the same one many times; a Qwen2.5-sized one holds ~100 MB of Python objects."""
_memo: OrderedDict[tuple[str, ...], BaseTokenizer] = OrderedDict()
_memo_lock = threading.Lock()


def memoised(key: tuple[str, ...], build: Callable[[], BaseTokenizer]) -> BaseTokenizer:
    """The tokenizer `build()` makes, made once per `key` (digests of what it is parsed from)
    among the `MEMO_SIZE` most recently used: parsing a tokenizer.json (JSON, then the Rust
    tokenizer) took ~0.3 s for SmolLM2's and a third of a small build, which loaded it ~20
    times. What it returns is shared: callers take a copy at their place (`BaseTokenizer.at`).

    Example: `memoised(("file", digest), lambda: parse(raw)).at(path, None)` parses once."""
    with _memo_lock:
        if key in _memo:
            _memo.move_to_end(key)
            return _memo[key]
    made = build()
    with _memo_lock:
        _memo[key] = made
        while len(_memo) > MEMO_SIZE:
            _memo.popitem(last=False)
    return made


# Byte values that some character's UTF-8 encoding holds (0xC0, 0xC1 and 0xF5..0xFF never occur).
UTF8_BYTES = frozenset([*range(0xC0), *range(0xC2, 0xF5)])


def token_texts(
    ids: Sequence[int], known: dict[int, str], texts_of: Callable[[list[int]], list[str]]
) -> list[str]:
    """Each id's own text (`texts_of(ids)`: one decoding per id, in one call), remembered in
    `known` (a token's text never changes)."""
    missing = [i for i in dict.fromkeys(ids) if i not in known]
    if missing:
        known.update(zip(missing, texts_of(missing), strict=True))
    return list(map(known.__getitem__, ids))


def merge_pair(merge: str | list[str]) -> tuple[str, str]:
    """A BPE merge from tokenizer.json (`"a b"` or `["a", "b"]`) as a pair of token strings."""
    if isinstance(merge, str):
        left, right = merge.split(" ", 1)
        return left, right
    return merge[0], merge[1]


@dataclass
class BaseTokenizer:
    """A base BPE tokenizer; `encode` treats special-token look-alikes in text as plain text."""

    tokenizer: Tokenizer
    json_obj: dict[str, Any]
    fingerprint: str
    path: Path | None = None
    model_dir: Path | None = None
    _token_texts: dict[int, str] = field(init=False, repr=False, default_factory=dict)
    _derived: dict[str, Any] = field(init=False, repr=False, default_factory=dict)
    """What is computed from `json_obj` on first use, shared by the copies at other places."""

    def __post_init__(self) -> None:
        if self.json_obj.get("model", {}).get("type") != "BPE":
            raise ValueError("MedTPE needs a tokenizer.json with a BPE model")

    def at(self, path: Path | None, model_dir: Path | None) -> BaseTokenizer:
        """This tokenizer read from another place: a copy sharing everything parsed."""
        placed = copy.copy(self)
        placed.path, placed.model_dir = path, model_dir
        return placed

    @property
    def _plain(self) -> Tokenizer:
        """The tokenizer without added-token matching (lossless on any text), built on first
        use: a Qwen2.5-sized vocabulary takes about a second to parse."""
        if "plain" not in self._derived:
            plain = json.dumps(dict(self.json_obj, added_tokens=[]))
            self._derived["plain"] = Tokenizer.from_str(plain)
        return self._derived["plain"]

    @property
    def content_fingerprint(self) -> str:
        """`canonical_fingerprint` of the tokenizer.json content, computed on first use."""
        if "content" not in self._derived:
            self._derived["content"] = canonical_fingerprint(self.json_obj)
        return self._derived["content"]

    @classmethod
    def load(cls, path: str | Path) -> BaseTokenizer:
        """Load a `tokenizer.json`, or a directory that holds one (parsed once per content in
        a process: `memoised`)."""
        path = Path(path)
        model_dir = path if path.is_dir() else None
        file = path / "tokenizer.json" if path.is_dir() else path
        raw = file.read_bytes()
        fingerprint = hashlib.sha256(raw).hexdigest()
        parsed = memoised(
            ("file", fingerprint),
            lambda: cls(Tokenizer.from_str(raw.decode("utf-8")), json.loads(raw), fingerprint),
        )
        return parsed.at(file, model_dir)

    @classmethod
    def from_json_obj(cls, obj: dict[str, Any], fingerprint: str) -> BaseTokenizer:
        """Build from an already parsed tokenizer.json whose file fingerprint is known."""
        return cls(
            tokenizer=Tokenizer.from_str(json.dumps(obj)), json_obj=obj, fingerprint=fingerprint
        )

    def encode(self, text: str, special_tokens: bool = False) -> list[int]:
        """Base ids of `text`, nothing added; `special_tokens=True` maps `<|im_end|>` to its id."""
        tok = self.tokenizer if special_tokens else self._plain
        return tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str], special_tokens: bool = False) -> list[list[int]]:
        """`encode` over many texts (parallel in Rust; no character offsets tracked)."""
        tok = self.tokenizer if special_tokens else self._plain
        return [e.ids for e in tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of base ids, special tokens included."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """Readable text of each token (its own decoding), each id decoded once per process."""
        return token_texts(ids, self._token_texts, self.decode_each)

    def decode_each(self, ids: Sequence[int]) -> list[str]:
        """`decode([i])` of each id, in one call (one id at a time took 1.6 s of every model
        load for SmolLM2's vocabulary)."""
        return self.decode_batch([[i] for i in ids])

    def decode_batch(self, sequences: Sequence[Sequence[int]]) -> list[str]:
        """`decode` of each sequence, in one call (parallel in Rust)."""
        return self.tokenizer.decode_batch([list(s) for s in sequences], skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def id_to_token(self, i: int) -> str | None:
        """The vocabulary string of id `i`."""
        return self.tokenizer.id_to_token(i)

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the added tokens (special or not): never evicted, never merged."""
        return frozenset(int(t["id"]) for t in self.json_obj.get("added_tokens", []))

    @property
    def is_byte_level(self) -> bool:
        """Whether the decoder is byte-level (GPT-2 style: each byte has a symbol character)."""
        decoder = self.json_obj.get("decoder") or {}
        parts = (
            decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
        )
        return any(d.get("type") == "ByteLevel" for d in parts)

    def byte_ids(self) -> dict[int, int]:
        """Byte value -> id of its byte-level symbol token, for the bytes the vocabulary has
        (empty when the tokenizer is not byte-level)."""
        if not self.is_byte_level:
            return {}
        vocab = self.tokenizer.get_vocab(with_added_tokens=False)
        return {b: vocab[c] for b, c in bytes_to_unicode().items() if c in vocab}

    def missing_bytes(self) -> list[int]:
        """Byte values that occur in valid UTF-8 but have no token in this byte-level vocabulary:
        the base tokenizer drops them (SmolLM2: 0x04 0x06 0x13 0x14 0x16 0x1D 0xF1 0xF2)."""
        if not self.is_byte_level:
            return []
        present = self.byte_ids()
        return sorted(b for b in UTF8_BYTES if b not in present)

    def merges(self) -> list[tuple[str, str]]:
        """The BPE merges, in rank order."""
        return [merge_pair(m) for m in self.json_obj["model"]["merges"]]
