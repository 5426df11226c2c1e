"""Short snippets of tokenized prompts for token-level distillation, cut where both tokenizers
agree, and drawn so that every MedTPE token is seen in enough contexts.

A snippet is a stretch of a prompt between two shared ends (`MedTPETokenizer.shared_ends`:
points where a MedTPE token and a base token end at the same character), so its MedTPE ids are
exactly the MedTPE encoding of its base ids, and the shared ends inside it are the positions
where the two models have read the same text (`pairs`). Cutting is O(n) per prompt.

Drawing is frequency-aware: in a seeded random order, a snippet is taken first when it holds a
MedTPE token seen in fewer than `min_per_token` snippets so far (rare tokens are not starved);
the places left are filled with the other snippets in the same order (natural frequencies).

>>> snippets = cut(tok, tok.base_encode(prompt, special_tokens=True), 64)  # doctest: +SKIP
>>> draw(tok, snippets, n=1000, min_per_token=8, seed=1)  # doctest: +SKIP
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from medtpe_core.tokenizer import MedTPETokenizer


@dataclass(frozen=True)
class Snippet:
    """One stretch of text under both tokenizers, with its aligned positions."""

    teacher: list[int]
    """Base (original) ids."""
    student: list[int]
    """MedTPE ids of the same text."""
    pairs: tuple[tuple[int, int], ...]
    """(student position, teacher position) of each shared end inside the snippet; never the
    first position (without a prefix, the first token is read without context on both sides)."""

    def to_json(self) -> dict[str, list]:
        """JSON-ready fields."""
        return {"teacher": self.teacher, "student": self.student, "pairs": list(self.pairs)}

    @classmethod
    def from_json(cls, data: dict[str, list]) -> Snippet:
        """The inverse of `to_json`."""
        return cls(data["teacher"], data["student"], tuple(map(tuple, data["pairs"])))


def cut(
    tokenizer: MedTPETokenizer,
    base_ids: Sequence[int],
    length: int,
    prefix: Sequence[int] = (),
) -> list[Snippet]:
    """Consecutive snippets of about `length` base ids (at least `length`, ended at the next
    shared end; the tail shorter than `length` is dropped) covering `base_ids`, each led on both
    sides by the ids `prefix` (e.g. the prompt's first token, the chat template's opening: the
    model makes its first position an attention sink with massive activations, and a snippet
    that opened on a MedTPE token let the student grow that sink at a later position instead, a
    relative error of 10^4 there)."""
    ids = tokenizer.encode_ids(base_ids)
    s_ends, t_ends = tokenizer.shared_ends(ids, base_ids)
    snippets = []
    s_start = t_start = 0
    first = 0  # index into the shared ends of the snippet's first end
    for k in range(len(t_ends)):
        if t_ends[k] + 1 - t_start < length:
            continue
        lead = len(prefix)
        pairs = tuple(
            (int(s - s_start) + lead, int(t - t_start) + lead)
            for s, t in zip(s_ends[first : k + 1], t_ends[first : k + 1], strict=True)
            if s > s_start or lead
        )
        snippets.append(
            Snippet(
                [*prefix, *base_ids[t_start : t_ends[k] + 1]],
                [*prefix, *ids[s_start : s_ends[k] + 1]],
                pairs,
            )
        )
        s_start, t_start, first = int(s_ends[k]) + 1, int(t_ends[k]) + 1, k + 1
    return snippets


def new_ids_in(tokenizer: MedTPETokenizer, ids: Iterable[int]) -> list[int]:
    """The MedTPE (new-token) ids among `ids`, with repeats."""
    new = {token.id for token in tokenizer.new_tokens}
    return [i for i in ids if i in new]


def draw(
    tokenizer: MedTPETokenizer,
    snippets: Sequence[Snippet],
    n: int,
    min_per_token: int,
    seed: int,
) -> list[Snippet]:
    """`n` of `snippets` (all when fewer), frequency-aware (see the module docstring), in the
    seeded order they were drawn."""
    order = list(range(len(snippets)))
    random.Random(seed).shuffle(order)
    contents = [new_ids_in(tokenizer, s.student) for s in snippets]
    seen: Counter[int] = Counter()
    chosen, rest = [], []
    for k in order:
        if len(chosen) >= n:
            break
        if any(seen[i] < min_per_token for i in contents[k]):
            chosen.append(k)
            seen.update(contents[k])
        else:
            rest.append(k)
    chosen += rest[: max(0, n - len(chosen))]
    return [snippets[k] for k in chosen]


def coverage(tokenizer: MedTPETokenizer, snippets: Sequence[Snippet]) -> dict[str, float]:
    """How the snippets cover the MedTPE tokens: occurrences, tokens seen at least once, and
    the contexts per seen token (min, median)."""
    counts = Counter(i for s in snippets for i in new_ids_in(tokenizer, s.student))
    values = np.array(sorted(counts.values())) if counts else np.zeros(1)
    return {
        "snippets": len(snippets),
        "teacher_tokens": sum(len(s.teacher) for s in snippets),
        "student_tokens": sum(len(s.student) for s in snippets),
        "new_token_occurrences": int(values.sum()),
        "new_tokens_seen": len(counts),
        "new_tokens": len(tokenizer.new_tokens),
        "contexts_per_token_min": int(values.min()),
        "contexts_per_token_median": float(np.median(values)),
    }
