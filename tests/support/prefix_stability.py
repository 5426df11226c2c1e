"""How much of a text's MedTPE encoding survives appending more text (the prefix cache's view).

The bound, derived from the encoder's three steps:

1. Base BPE: the base tokenizer splits text into pre-tokens (byte-level regex) and runs BPE on
   each separately. Appending text can only change the LAST pre-token of `a` (it may join the
   appended text or split differently, e.g. trailing spaces before a word), so the base ids of
   `a`'s earlier pre-tokens — the ids of `a_head`, `a` cut before its last pre-token — stay.
2. Evicted-token decomposition maps each id on its own: a common prefix stays common.
3. Pair merging (`medtpe.core.tokenizer.encoding.PairMerger`) runs one left-to-right pass per merge
   level; a pass decides each pair from the pairs to its left, so where two inputs first differ at
   position f, every output covering positions before f - 1 is the same: each pass moves the
   difference at most one token to the left, and only `merge_depth` passes can merge anything.

So (without a plain tail) `encode(a + b)` starts with the first
`len(encode(a_head)) - merge_depth` ids of `encode(a)`, for every `b`: only the ids of `a`'s last
pre-token and at most `merge_depth` ids before them can change. Characters spelled by the byte
fallback are encoded byte by byte between pieces that are encoded separately, which keeps the
same bound.

4. A plain tail (`MedTPETokenizer.plain_tail`, k ids left unmerged at the end): `encode(a)` is
   its unmerged ids with all but the last k merged, and the text appended moves the cut; the
   merging's inputs still agree on `a_head`'s unmerged ids but its last k, so k more ids of
   `encode(a_head)` can change: the stable length is `len(encode(a_head)) - k - merge_depth`.
"""

from __future__ import annotations

from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.core.tokenizer.encoding import merge_depth


def last_pretoken_start(tokenizer: MedTPETokenizer, text: str) -> int:
    """Character offset where the base pre-tokenizer's last piece of `text` starts (0 if none)."""
    pre_tokenizer = tokenizer.base.tokenizer.pre_tokenizer
    if pre_tokenizer is None or not text:
        return 0
    pieces = pre_tokenizer.pre_tokenize_str(text)
    return pieces[-1][1][0] if pieces else 0


def stable_prefix_length(tokenizer: MedTPETokenizer, text: str) -> int:
    """How many leading ids of `tokenizer.encode(text)` no appended text can change."""
    head = text[: last_pretoken_start(tokenizer, text)]
    unstable = tokenizer.plain_tail + merge_depth(tokenizer.merges)
    return max(0, len(tokenizer.encode(head)) - unstable)
