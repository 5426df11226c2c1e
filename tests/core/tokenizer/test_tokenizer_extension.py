"""The extension ("without replacement") twin of a MedTPE tokenizer: fresh ids after the base
vocabulary, nothing evicted, the same tokens as the replacement build up to the ids' names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.core.tokenizer.without_replacement import SOURCE_SETTING, extension_twin, fresh_ids
from tests.support.properties import examples
from tests.support.tokenizer_support import (
    ANY_TEXT,
    DENSE_TEXT,
    MIXED_TEXT,
    icu_records,
    small_extension,
    small_medtpe,
    smollm2_extension,
    smollm2_medtpe,
)

PAIRS = {
    "smollm2-static": (lambda: smollm2_medtpe("static", 2), lambda: smollm2_extension("static", 2)),
    "smollm2-bpe3": (lambda: smollm2_medtpe("bpe", 3), lambda: smollm2_extension("bpe", 3)),
    "small-bpe3": (lambda: small_medtpe("bpe", 3), lambda: small_extension("bpe", 3)),
}


@pytest.fixture(scope="module", params=sorted(PAIRS))
def pair(request: pytest.FixtureRequest) -> tuple[MedTPETokenizer, MedTPETokenizer]:
    """(replacement tokenizer, its extension twin)."""
    source, twin = PAIRS[request.param]
    return source(), twin()


def test_twin_ids(pair: tuple[MedTPETokenizer, MedTPETokenizer]) -> None:
    source, twin = pair
    vocab, m = source.base.vocab_size, len(source.new_tokens)
    assert [t.string for t in twin.new_tokens] == [t.string for t in source.new_tokens]
    assert [t.constituents for t in twin.new_tokens] == [t.constituents for t in source.new_tokens]
    assert [t.id for t in twin.new_tokens] == list(range(vocab, vocab + m))
    assert list(twin.byte_fallback) == list(source.byte_fallback)
    assert list(twin.byte_fallback.values()) == list(
        range(vocab + m, vocab + m + len(source.byte_fallback))
    )
    assert twin.evicted == {} and twin.is_extension and not source.is_extension
    assert twin.vocab_size == vocab + m + len(source.byte_fallback)
    assert source.vocab_size == vocab
    assert twin.artefact_id != source.artefact_id
    assert twin.settings[SOURCE_SETTING] == source.artefact_id
    with pytest.raises(ValueError, match="already"):
        extension_twin(twin)


def test_same_tokens_on_icu_records(pair: tuple[MedTPETokenizer, MedTPETokenizer]) -> None:
    """Records without an evicted token: the same segmentation, ids mapped one to one."""
    source, twin = pair
    ids = fresh_ids(source)
    for text in icu_records(5, seed=3):
        assert not source.evicted.keys() & set(source.base_encode(text))
        assert twin.encode(text) == [ids.get(i, i) for i in source.encode(text)]


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(MIXED_TEXT, ANY_TEXT, DENSE_TEXT))
def test_twin_is_lossless_and_maps_one_to_one(text: str) -> None:
    """Arbitrary Unicode round-trips; the twin keeps the base tokenization whole, so its ids
    expand to exactly the base ids, and where no evicted base token occurs both builds give the
    same number of tokens, ids mapped one to one."""
    for name in ("smollm2-bpe3", "small-bpe3"):
        source, twin = (make() for make in PAIRS[name])
        ids = twin.encode(text)
        assert twin.decode(ids) == text
        assert twin.decode(twin.encode(text, special_tokens=True)) == text
        assert all(0 <= i < twin.vocab_size for i in ids)
        if not twin.needs_fallback(text):
            assert twin.to_base_ids(ids) == twin.base_encode(text)
            assert ids == twin.encode_ids(twin.base_encode(text))
        if not source.evicted.keys() & set(ids):
            mapped = fresh_ids(source)
            assert ids == [mapped.get(i, i) for i in source.encode(text)]


def test_evicted_tokens_stay_whole() -> None:
    source, twin = smollm2_medtpe("static", 2), smollm2_extension("static", 2)
    new_ids = {t.id for t in source.new_tokens}
    kept = 0
    for i in sorted(source.evicted.keys() & new_ids)[:50]:
        text = source.base.decode([i])
        if source.base_encode(text) == [i]:
            assert twin.encode(text) == [i] and len(source.encode(text)) > 1
            kept += 1
    assert kept > 10


def test_artefact_round_trip_and_stock_detokenizer(
    pair: tuple[MedTPETokenizer, MedTPETokenizer], tmp_path: Path
) -> None:
    source, twin = pair
    twin.save(tmp_path / "twin")
    source.save(tmp_path / "source")
    loaded = MedTPETokenizer.load(tmp_path / "twin")  # base rebuilt from the detokenizer
    assert loaded.artefact_id == twin.artefact_id
    assert loaded.base.content_fingerprint == source.base.content_fingerprint
    assert MedTPETokenizer.load(tmp_path / "twin", base=source.base).is_extension
    doc = json.loads((tmp_path / "source" / "medtpe.json").read_text())
    assert "fresh_ids" not in doc["detokenizer"]  # replacement artefacts as before
    detok = Tokenizer.from_file(str(tmp_path / "twin" / "tokenizer.json"))
    assert detok.get_vocab_size(with_added_tokens=True) == twin.vocab_size
    for token in twin.new_tokens:
        assert detok.id_to_token(token.id) == token.string
    for text in [*icu_records(2, seed=11), "a\x04b\U00050000 c"]:
        ids = twin.encode(text)
        assert detok.decode(ids, skip_special_tokens=False) == text
