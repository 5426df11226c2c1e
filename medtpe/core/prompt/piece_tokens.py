"""Token ids of text pieces (record lines, headers), cached per encoder and shared across records.

Rendered records are made of lines that repeat across records and requests ("Heart Rate: 80 bpm",
"[08:00]"), so each distinct line is encoded once per process (a bounded LRU per encoder). When
the encoder splits text at a newline between two non-space characters whatever surrounds it (true
of byte-level BPE tokenizers with GPT-2, Llama-3 or Qwen2 pre-tokenisation, checked once per
encoder by `splits_at_newlines`), a whole record's ids are the concatenation of its lines' ids
(a line with whitespace at an end together with its neighbour there: `joined_pieces`): the
record is never encoded as a whole.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from itertools import chain
from typing import Protocol

PIECE_CACHE_SIZE = 65_536
"""Distinct pieces kept per encoder (a few tens of MB at most)."""
_ENCODERS_KEPT = 8

# characters of every class a pre-tokenizer regex tells apart: letters (Latin, accented, CJK),
# digits, punctuation, symbols, a combining mark, an emoji, a control character
_PROBE_CHARS = "aZéß5%)(][.,:;'\"-/°µ中😀\u0301\x00_#<>|+=*~"


class TokenEncoder(Protocol):
    """What rendering needs from a tokenizer (`BaseTokenizer` fits)."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens added."""
        ...


def splits_at_newlines(encoder: TokenEncoder) -> bool:
    """Whether `encode(a + "\\n" + b) == encode(a + "\\n") + encode(b)` for `a` ending and `b`
    starting with a non-space character, probed over every pair of character classes."""
    pairs = [
        (left, right)
        for x in _PROBE_CHARS
        for y in _PROBE_CHARS
        for left, right in ((f"word{x}", f"{y}word"), (x, y), (f"1{x}", f"{y}2 x"))
    ]
    pairs += [("Rate: 80 bpm", "'s x"), ("12", "34"), ("a", "\u200bb")]
    texts = [text for left, right in pairs for text in (f"{left}\n{right}", f"{left}\n", right)]
    ids = encoder.encode_batch(texts)
    return all(ids[i] == ids[i + 1] + ids[i + 2] for i in range(0, len(ids), 3))


def joined_pieces(lines: list[str]) -> list[str]:
    """The text of `lines` joined by newlines as consecutive pieces that are encoded apart: each
    line with its newline, except that a line that is empty or starts or ends with whitespace is
    kept in one piece with its neighbours on those sides (its tokens may change next to a
    newline)."""
    pieces = [line + "\n" for line in lines[:-1]] + lines[-1:]
    loose = [
        i for i, line in enumerate(lines) if not line or line[0].isspace() or line[-1].isspace()
    ]
    if not loose:
        return pieces
    glued = set()  # piece k joins piece k - 1
    for i in loose:
        line = lines[i]
        if not line or line[0].isspace():
            glued.add(i)
        if not line or line[-1].isspace():
            glued.add(i + 1)
    out: list[str] = []
    for k, piece in enumerate(pieces):
        if out and k in glued:
            out[-1] += piece
        else:
            out.append(piece)
    return out


class PieceTokens:
    """Ids of text pieces under one encoder, with an LRU cache of `PIECE_CACHE_SIZE` pieces."""

    def __init__(self, encoder: TokenEncoder, capacity: int = PIECE_CACHE_SIZE) -> None:
        self.encoder = encoder
        self.capacity = capacity
        self._ids: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()
        self.composes = splits_at_newlines(encoder)
        """Whether newline-joined lines may be encoded line by line (see the module docstring)."""

    def ids(self, pieces: list[str]) -> list[list[int]]:
        """Token ids of each piece; the pieces not seen lately are encoded in one batch
        (thread-safe: records are rendered in worker threads)."""
        cache = self._ids
        distinct = dict.fromkeys(pieces)
        with self._lock:
            found = {p: cache[p] for p in distinct if p in cache}
            deque(map(cache.move_to_end, found), maxlen=0)  # the newest in the LRU order
        if len(found) < len(distinct):
            missing = [p for p in distinct if p not in found]
            encoded = dict(zip(missing, self.encoder.encode_batch(missing), strict=True))
            found.update(encoded)
            with self._lock:
                cache.update(encoded)
                while len(cache) > self.capacity:
                    cache.popitem(last=False)
        return list(map(found.__getitem__, pieces))

    def counts(self, pieces: list[str]) -> list[int]:
        """Token count of each piece."""
        return list(map(len, self.ids(pieces)))

    def join(self, lines: list[str]) -> list[int] | None:
        """Ids of the `lines` joined by newlines, from the cached ids of their pieces
        (`joined_pieces`); None when the encoder does not allow it."""
        if not self.composes:
            return None
        return list(chain.from_iterable(self.ids(joined_pieces(lines))))


_REGISTRY_LOCK = threading.Lock()
_BY_ENCODER: OrderedDict[int, tuple[TokenEncoder, PieceTokens]] = OrderedDict()


def piece_tokens(encoder: TokenEncoder) -> PieceTokens:
    """The process-wide `PieceTokens` of `encoder` (the last few encoders are kept)."""
    key = id(encoder)
    with _REGISTRY_LOCK:
        held = _BY_ENCODER.get(key)
        if held is not None and held[0] is encoder:
            _BY_ENCODER.move_to_end(key)
            return held[1]
        pieces = PieceTokens(encoder)
        _BY_ENCODER[key] = (encoder, pieces)
        while len(_BY_ENCODER) > _ENCODERS_KEPT:
            _BY_ENCODER.popitem(last=False)
        return pieces
