"""`medtpe.core.tokenizer.snippets`: snippets cut where both tokenizers agree are exact slices of
both encodings, their aligned positions read the same text, and the frequency-aware draw covers
every new token the pool holds."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings

from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.core.tokenizer.snippets import (
    OPENING_LIMIT,
    Snippet,
    coverage,
    cut,
    draw,
    new_ids_in,
    opening,
)
from tests.support.properties import examples
from tests.support.tokenizer_support import MIXED_TEXT, icu_records, smollm2_medtpe


@pytest.fixture(scope="module")
def tok() -> MedTPETokenizer:
    return smollm2_medtpe("static", 2)


@settings(max_examples=examples(50), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=MIXED_TEXT)
def test_snippets_are_slices_that_read_the_same_text(tok: MedTPETokenizer, text: str) -> None:
    base = tok.base_encode(text)
    snippets = cut(tok, base, 8)
    joined_teacher = [i for s in snippets for i in s.teacher]
    assert joined_teacher == base[: len(joined_teacher)]  # consecutive, from the start
    for snippet in snippets:
        assert len(snippet.teacher) >= 8
        assert snippet.student == tok.encode_ids(snippet.teacher)  # the MedTPE encoding of it
        assert tok.decode(snippet.student) == tok.base.decode(snippet.teacher)
        assert all(s > 0 for s, _ in snippet.pairs)
        every = max(1, len(snippet.pairs) // 4)  # decoding prefixes is quadratic: 4 spread
        for s, t in snippet.pairs[::every]:
            assert tok.decode(snippet.student[: s + 1]) == tok.base.decode(snippet.teacher[: t + 1])
    assert len(base) - len(joined_teacher) < 8  # only a tail shorter than a snippet is dropped


def test_icu_text_snippets_hold_many_new_tokens(tok: MedTPETokenizer) -> None:
    base = tok.base_encode(icu_records(1)[0])
    snippets = cut(tok, base, 64)
    assert len(snippets) == len(base) // 64 or len(snippets) == len(base) // 64 - 1
    per_snippet = [len(new_ids_in(tok, s.student)) for s in snippets]
    assert min(per_snippet) > 10  # ICU text compresses: dozens of MedTPE tokens per snippet
    assert all(len(s.pairs) == len(s.student) - 1 for s in snippets)  # no evicted ids here


def test_draw_covers_rare_tokens_first(tok: MedTPETokenizer) -> None:
    pool = [s for text in icu_records(8) for s in cut(tok, tok.base_encode(text), 32)]
    in_pool = Counter(i for s in pool for i in set(new_ids_in(tok, s.student)))
    drawn = draw(tok, pool, 40, min_per_token=2, seed=3)
    assert len(drawn) == 40 and len({id(s) for s in drawn}) == 40
    seen = Counter(i for s in drawn for i in set(new_ids_in(tok, s.student)))
    # every token the pool holds in two snippets or more is seen twice, if 40 snippets can do it
    needy = sum(1 for i, n in in_pool.items() if n >= 2 and seen[i] < 2)
    natural = draw(tok, pool, 40, min_per_token=0, seed=3)
    seen_natural = Counter(i for s in natural for i in set(new_ids_in(tok, s.student)))
    assert len(seen) >= len(seen_natural)
    assert needy <= sum(1 for i, n in in_pool.items() if n >= 2 and seen_natural[i] < 2)
    assert draw(tok, pool, 40, 2, 3) == drawn  # seeded
    figures = coverage(tok, drawn)
    assert figures["snippets"] == 40 and figures["new_tokens_seen"] == len(seen)
    assert figures["teacher_tokens"] > figures["student_tokens"]


def test_snippet_json_round_trip(tok: MedTPETokenizer) -> None:
    snippet = cut(tok, tok.base_encode(icu_records(1)[0]), 16)[0]
    assert Snippet.from_json(snippet.to_json()) == snippet


def test_a_prefix_leads_both_sides(tok: MedTPETokenizer) -> None:
    """Every snippet can open on the prompt's first token (the model's attention sink) on both
    sides; the aligned positions move with it and the prefix itself is never one."""
    base = tok.base_encode(icu_records(1)[0])
    plain, led = cut(tok, base, 32), cut(tok, base, 32, prefix=[1])
    assert len(plain) == len(led)
    for a, b in zip(plain, led, strict=True):
        assert b.teacher == [1, *a.teacher] and b.student == [1, *a.student]
        assert min(s for s, _ in b.pairs) >= 1
        shifted = {(s + 1, t + 1) for s, t in a.pairs}
        assert shifted <= set(b.pairs)  # plus the first token's end when it is shared


@settings(max_examples=examples(50), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=MIXED_TEXT)
def test_the_opening_is_read_the_same_by_both_models(tok: MedTPETokenizer, text: str) -> None:
    base = tok.base_encode(text)
    lead = opening(tok, base)
    assert lead == base[: len(lead)] and len(lead) <= OPENING_LIMIT
    assert tok.encode_ids(lead) == lead  # no MedTPE token in it


def test_an_icu_prompt_opens_on_its_chat_template(tok: MedTPETokenizer) -> None:
    """The opening of a chat prompt is its template's system turn; every snippet's first
    MedTPE token sits behind it."""
    base = tok.base_encode(
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\n"
        + icu_records(1)[0],
        special_tokens=True,
    )
    lead = opening(tok, base)
    assert tok.base.decode(lead).startswith("<|im_start|>system\nYou are a helpful assistant")
    for snippet in cut(tok, base, 64, lead):
        first_new = next(k for k, i in enumerate(snippet.student) if i != snippet.teacher[k])
        assert first_new >= len(lead)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=MIXED_TEXT)
def test_a_tail_snippet_reads_the_last_position(tok: MedTPETokenizer, text: str) -> None:
    base = tok.base_encode(text)
    snippets = cut(tok, base, 8, prefix=[1], tail=True)
    if not base:
        assert snippets == []
        return
    last = snippets[-1]
    assert last.teacher[1:] == base[len(base) - len(last.teacher) + 1 :]  # ends at the end
    assert last.student == [1, *tok.encode_ids(last.teacher[1:])]
    assert last.pairs[-1] == (len(last.student) - 1, len(last.teacher) - 1)
    assert len(last.teacher) - 1 >= 8 or len(last.teacher) - 1 == len(base)
