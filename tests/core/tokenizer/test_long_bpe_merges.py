"""The tokenizer invariants on BPE builds whose tokens run up to 8 base tokens (`max_n` 8: merges
of merges, several levels deep), where the shared builds stop at 3: lossless on any string, the
fast path equal to the base ids merged, shorter than the base on records and at most 1 % longer
on plain English, and the prefix-stability bound of `tests.support.prefix_stability`."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.core.tokenizer.encoding import merge_depth
from tests.support.prefix_stability import stable_prefix_length
from tests.support.properties import examples
from tests.support.tokenizer_support import (
    ANY_TEXT,
    DENSE_TEXT,
    EDGE_CASES,
    ENGLISH,
    MIXED_TEXT,
    icu_records,
    small_medtpe,
    smollm2_medtpe,
)

LONG_N = 8
BUILDS = {
    "smollm2-bpe8": lambda: smollm2_medtpe("bpe", LONG_N),
    "small-bpe8": lambda: small_medtpe("bpe", LONG_N),
}


@cache
def build(name: str) -> MedTPETokenizer:
    """The build `name`, made once."""
    return BUILDS[name]()


@pytest.mark.parametrize("name", BUILDS)
def test_tokens_are_long_and_merged_several_levels_deep(name: str) -> None:
    """The builds exercise what N = 2 and 3 do not: tokens of 4..8 ids, merges of merges."""
    tok = build(name)
    lengths = [len(t.constituents) for t in tok.new_tokens]
    assert max(lengths) > 3 and max(lengths) <= LONG_N and min(lengths) >= 2
    assert merge_depth(tok.merges) >= 3


@pytest.mark.parametrize("name", BUILDS)
@pytest.mark.parametrize("text", EDGE_CASES)
def test_edge_cases_round_trip(name: str, text: str) -> None:
    tok = build(name)
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text, special_tokens=True)) == text


@pytest.mark.parametrize("name", BUILDS)
@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(MIXED_TEXT, ANY_TEXT, DENSE_TEXT))
def test_any_string_round_trips_exactly(name: str, text: str) -> None:
    tok = build(name)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)
    if not tok.needs_fallback(text):  # fast path: exactly the base ids, decomposed and merged
        assert ids == tok.encode_ids(tok.base_encode(text))


@pytest.mark.parametrize("name", BUILDS)
def test_records_are_shorter_and_english_at_most_one_percent_longer(name: str) -> None:
    tok = build(name)
    for record in icu_records(10, seed=13):
        assert len(tok.encode(record)) < len(tok.base_encode(record))
    if name.startswith("smollm2"):  # the small base is trained on the records themselves
        assert len(tok.encode(ENGLISH)) <= 1.01 * len(tok.base_encode(ENGLISH))


def test_stock_detokenizer_decodes_long_tokens(tmp_path) -> None:
    tok = build("smollm2-bpe8")
    tok.save(tmp_path)
    detok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in [*EDGE_CASES, *icu_records(3, seed=11)]:
        assert detok.decode(tok.encode(text), skip_special_tokens=False) == text


@settings(max_examples=examples(200), deadline=None)
@given(a=MIXED_TEXT, b=MIXED_TEXT)
def test_appending_text_keeps_all_but_the_last_ids(a: str, b: str) -> None:
    tok = build("smollm2-bpe8")
    k = stable_prefix_length(tok, a)
    assert tok.encode(a + b)[:k] == tok.encode(a)[:k]
