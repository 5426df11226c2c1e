"""decode(encode(s)) == s for every string, on the default model's tokenizer and a small one."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizer_support import icu_records, small_medtpe, smollm2_dir, smollm2_medtpe
from tokenizers import Tokenizer

from medtpe_core.tokenizer import MedTPETokenizer

EDGE_CASES = [
    "",
    " ",
    "<|im_start|>user\nhi<|im_end|>",
    "<|endoftext|><|endoftext|>",
    "a<|im_end",
    "😀👩‍⚕️ 中文病历 テスト",
    "\x00\x01\x02\t\r\n\x7f\u200b\ufeff",
    "1" * 500,
    "2180-03-23 11:51:00 " * 30,
    "   leading and trailing   ",
    "\n\n\n[2180-01-01 00:00] Heart Rate: 87.0 bpm\n",
    "\ud7ff\ue000\U0010ffff",
]

TOKENIZERS = {
    "smollm2-static": lambda: smollm2_medtpe("static", 2),
    "smollm2-bpe3": lambda: smollm2_medtpe("bpe", 3),
    "small-bpe3": lambda: small_medtpe("bpe", 3),
    "small-static3": lambda: small_medtpe("static", 3),
}
# SmolLM2's vocabulary has no token for bytes 0x04 0x06 0x13 0x14 0x16 0x1D (nor for the lead
# bytes of U+40000..U+BFFFF): its own tokenizer drops them. Strings without them must round-trip
# exactly; any string must round-trip exactly as far as the base tokenizer does.
_UNREPRESENTABLE = "\x04\x06\x13\x14\x16\x1d"
_text = st.text(
    st.characters(codec="utf-8", max_codepoint=0x3FFFF, exclude_characters=_UNREPRESENTABLE),
    max_size=200,
)
_any_text = st.text(st.characters(codec="utf-8"), max_size=200)
_mixed = st.lists(
    st.one_of(_text, st.sampled_from(EDGE_CASES), st.sampled_from(icu_records(3, seed=5))),
    max_size=4,
).map("".join)


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


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_mixed)
def test_round_trip_property(tok: MedTPETokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.base.vocab_size for i in ids)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_any_text)
def test_any_string_round_trips_as_far_as_the_base_does(tok: MedTPETokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == tok.base.decode(tok.base_encode(text))


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(_mixed, max_size=6))
def test_encode_batch_matches_encode(texts: list[str]) -> None:
    tok = smollm2_medtpe("bpe", 3)
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_stock_detokenizer_decodes_medtpe_ids(tmp_path: Path) -> None:
    for name, make in TOKENIZERS.items():
        tok = make()
        tok.save(tmp_path / name)
        detok = Tokenizer.from_file(str(tmp_path / name / "tokenizer.json"))
        assert detok.get_vocab_size(with_added_tokens=True) == tok.base.vocab_size
        for text in [*EDGE_CASES, *icu_records(3, seed=11)]:
            ids = tok.encode(text)
            assert detok.decode(ids, skip_special_tokens=False) == tok.decode(ids) == text


def test_fixture_is_the_default_model_tokenizer() -> None:
    tok = smollm2_medtpe("static", 2)
    assert tok.base.vocab_size == 49152
    assert (smollm2_dir() / "tokenizer.json").is_file()
