"""Invariants of the dependency-aware replacement."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.core.tokenizer.replacement import MergeGraph, single_char_ids
from tests.support.tokenizer_support import (
    ENGLISH,
    PROTECTED_TEXT,
    REPLACEMENT_BUILDS,
    icu_records,
    smollm2_medtpe,
)


@pytest.fixture(scope="module", params=sorted(REPLACEMENT_BUILDS))
def tok(request: pytest.FixtureRequest) -> MedTPETokenizer:
    return REPLACEMENT_BUILDS[request.param]()


def test_ids_are_reused_without_collision(tok: MedTPETokenizer) -> None:
    new_ids = [t.id for t in tok.new_tokens]
    assert len(set(new_ids)) == len(new_ids) > 0
    # every evicted id serves one new token or one missing byte (byte fallback), never both
    assert not set(new_ids) & tok.fallback_ids
    assert set(new_ids) | tok.fallback_ids == set(tok.evicted)
    assert all(0 <= i < tok.base.vocab_size for i in new_ids)
    strings = [t.string for t in tok.new_tokens]
    assert len(set(strings)) == len(strings)
    assert not set(strings) & set(tok.base.tokenizer.get_vocab(with_added_tokens=True))


def test_protected_tokens_are_never_evicted(tok: MedTPETokenizer) -> None:
    graph = MergeGraph(tok.base)
    dependent = graph.ancestry({i for t in tok.new_tokens for i in t.constituents})
    prompt_ids = set(tok.base_encode(PROTECTED_TEXT, special_tokens=True))
    prompt_ids |= set(tok.base_encode(PROTECTED_TEXT))
    for protected in (dependent, tok.base.special_ids, single_char_ids(tok.base), prompt_ids):
        assert not protected & set(tok.evicted)


def test_evicted_tokens_decompose_into_survivors(tok: MedTPETokenizer) -> None:
    for i, parts in tok.evicted.items():
        assert len(parts) >= 2
        assert not set(parts) & set(tok.evicted)
        assert "".join(tok.base.id_to_token(p) for p in parts) == tok.base.id_to_token(i)


def test_new_tokens_are_runs_of_surviving_base_tokens(tok: MedTPETokenizer) -> None:
    max_n = tok.settings["max_n"]
    for t in tok.new_tokens:
        assert 2 <= len(t.constituents) <= max_n
        assert not set(t.constituents) & set(tok.evicted)
        assert t.string == "".join(tok.base.id_to_token(c) for c in t.constituents)


def test_surviving_tokens_segment_as_in_the_base(tok: MedTPETokenizer) -> None:
    """Before TPE merging, MedTPE's ids are the base ids with evicted ones split."""
    survivors = [
        i
        for i in range(tok.base.vocab_size)
        if i not in tok.evicted and i not in tok.base.special_ids
    ]
    texts = [tok.base.decode([i]) for i in survivors]
    texts += [ENGLISH, *icu_records(3, seed=3)]
    for text in texts:
        base_ids = tok.base_encode(text)
        expected = [p for i in base_ids for p in tok.evicted.get(i, (i,))]
        assert tok.to_base_ids(tok.encode(text)) == expected


def test_vocabulary_size_is_unchanged(tok: MedTPETokenizer, tmp_path: Path) -> None:
    tok.save(tmp_path)
    detok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert detok.get_vocab_size(with_added_tokens=True) == tok.base.vocab_size


def test_plain_english_costs_at_most_one_percent_more() -> None:
    tok = smollm2_medtpe("bpe", 3)
    assert len(tok.encode(ENGLISH)) <= 1.01 * len(tok.base_encode(ENGLISH))


def test_prefix_stability() -> None:
    """Appending events changes only the last few MedTPE tokens of the earlier text."""
    tok = smollm2_medtpe("bpe", 3)
    record = icu_records(1, seed=21)[0]
    head, tail = record[: len(record) // 2], record[len(record) // 2 :]
    before, after = tok.encode(head), tok.encode(head + tail)
    pairs = enumerate(zip(before, after, strict=False))
    common = next((k for k, (a, b) in pairs if a != b), len(before))
    assert common >= len(before) - 4
