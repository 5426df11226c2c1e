"""decode(encode(s)) == s for every string, on the default model's tokenizer and a small one,
replacement builds and their extension ("without replacement") twins."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from medtpe.core.tokenizer import MedTPETokenizer
from tests.support.properties import examples
from tests.support.tokenizer_support import (
    ANY_TEXT,
    DENSE_TEXT,
    EDGE_CASES,
    MIXED_TEXT,
    REPLACEMENT_BUILDS,
    icu_records,
    small_extension,
    smollm2_dir,
    smollm2_extension,
    smollm2_medtpe,
)

TOKENIZERS = {
    **REPLACEMENT_BUILDS,
    "smollm2-bpe3-extension": lambda: smollm2_extension("bpe", 3),
    "small-bpe3-extension": lambda: small_extension("bpe", 3),
}


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def tok(request: pytest.FixtureRequest) -> MedTPETokenizer:
    return TOKENIZERS[request.param]()


@pytest.mark.parametrize("text", EDGE_CASES)
def test_edge_cases_round_trip(tok: MedTPETokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text, special_tokens=True)) == text


def test_special_token_look_alikes_are_plain_text(tok: MedTPETokenizer) -> None:
    text = "<|im_start|>user\nhi<|im_end|>"
    assert not tok.base.special_ids.intersection(tok.base_encode(text))
    assert tok.base.special_ids.intersection(tok.encode(text, special_tokens=True))


# 300 strings on each of the six builds (1,800 in all; the arbitrary strings below add 3,000 on
# the byte-fallback builds); 1,000 each took 50 s in CI's profile, 6 minutes in a loaded local run
@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=MIXED_TEXT)
def test_round_trip_property(tok: MedTPETokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)


@pytest.mark.parametrize("name", ["smollm2-static", "smollm2-bpe3", "smollm2-bpe3-extension"])
@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(ANY_TEXT, DENSE_TEXT))
def test_any_string_round_trips_exactly(name: str, text: str) -> None:
    """Arbitrary Unicode, control characters included, on the builds that need byte fallback."""
    tok = TOKENIZERS[name]()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text, special_tokens=True)) == text
    if not tok.needs_fallback(text):  # fast path: exactly the base ids, decomposed and merged
        assert ids == tok.encode_ids(tok.base_encode(text))


@settings(max_examples=examples(100), deadline=None)
@given(texts=st.lists(MIXED_TEXT, max_size=6))
def test_encode_batch_matches_encode(texts: list[str]) -> None:
    tok = smollm2_medtpe("bpe", 3)
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


@pytest.fixture(scope="module")
def stock_detokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    """Each build saved once, its tokenizer.json read back by the stock `tokenizers` library."""
    out = tmp_path_factory.mktemp("detok")
    for name, make in TOKENIZERS.items():
        make().save(out / name)
    return {name: Tokenizer.from_file(str(out / name / "tokenizer.json")) for name in TOKENIZERS}


def test_stock_detokenizer_decodes_medtpe_ids(stock_detokenizers: dict[str, Tokenizer]) -> None:
    for name, make in TOKENIZERS.items():
        tok, detok = make(), stock_detokenizers[name]
        assert detok.get_vocab_size(with_added_tokens=True) == tok.vocab_size
        for text in [*EDGE_CASES, *icu_records(3, seed=11)]:
            ids = tok.encode(text)
            assert detok.decode(ids, skip_special_tokens=False) == tok.decode(ids) == text


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=MIXED_TEXT)
def test_stock_detokenizer_matches_on_any_string(
    stock_detokenizers: dict[str, Tokenizer], text: str
) -> None:
    ids = smollm2_medtpe("bpe", 3).encode(text)
    assert stock_detokenizers["smollm2-bpe3"].decode(ids, skip_special_tokens=False) == text


def test_fixture_is_the_default_model_tokenizer() -> None:
    tok = smollm2_medtpe("static", 2)
    assert tok.base.vocab_size == 49152
    assert (smollm2_dir() / "tokenizer.json").is_file()
