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
    # bytes SmolLM2's vocabulary lacks (its own tokenizer drops them): byte fallback
    "\x04\x06\x13\x14\x16\x1d",
    "a\x04b. \x13x\x1d\x1d<|im_end|>\x06",
    "\U00040000\U00050000z\U000bffff\U000c0000 \U0003ffff",
    "<|im_start|>\x14user\n\U00080001<|im_end|>",
]

TOKENIZERS = {
    "smollm2-static": lambda: smollm2_medtpe("static", 2),
    "smollm2-bpe3": lambda: smollm2_medtpe("bpe", 3),
    "small-bpe3": lambda: small_medtpe("bpe", 3),
    "small-static3": lambda: small_medtpe("static", 3),
}
# SmolLM2's vocabulary has no token for bytes 0x04 0x06 0x13 0x14 0x16 0x1D nor for 0xF1 0xF2
# (lead bytes of U+40000..U+BFFFF): its own tokenizer drops them, MedTPE spells them with its
# byte-fallback ids. Every string round-trips exactly.
_FALLBACK_CHARS = "\x04\x06\x13\x14\x16\x1d\U00040000\U0007ffff\U00080000\U000bffff"
_text = st.text(st.characters(codec="utf-8"), max_size=200)
# dense in the characters that need the fallback, next to text they could merge with
_dense = st.lists(
    st.one_of(
        st.sampled_from(_FALLBACK_CHARS),
        st.characters(min_codepoint=0x40000, max_codepoint=0xBFFFF),
        st.sampled_from([" ", "\n", "a", ".", "1", "<|im_end|>", "Heart Rate", "é", "中"]),
        st.characters(codec="utf-8"),
    ),
    max_size=40,
).map("".join)
_mixed = st.lists(
    st.one_of(_text, _dense, st.sampled_from(EDGE_CASES), st.sampled_from(icu_records(3, seed=5))),
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


@pytest.mark.parametrize("name", ["smollm2-static", "smollm2-bpe3"])
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(_text, _dense))
def test_any_string_round_trips_exactly(name: str, text: str) -> None:
    """Arbitrary Unicode, control characters included, on the builds that need byte fallback."""
    tok = TOKENIZERS[name]()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text, special_tokens=True)) == text
    if not tok.needs_fallback(text):  # fast path: exactly the base ids, decomposed and merged
        assert ids == tok.encode_ids(tok.base_encode(text))


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


_DETOK: dict[str, Tokenizer] = {}


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_mixed)
def test_stock_detokenizer_matches_on_any_string(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    tok = smollm2_medtpe("bpe", 3)
    if "smollm2-bpe3" not in _DETOK:
        out = tmp_path_factory.mktemp("detok")
        tok.save(out)
        _DETOK["smollm2-bpe3"] = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = tok.encode(text)
    assert _DETOK["smollm2-bpe3"].decode(ids, skip_special_tokens=False) == text


def test_fixture_is_the_default_model_tokenizer() -> None:
    tok = smollm2_medtpe("static", 2)
    assert tok.base.vocab_size == 49152
    assert (smollm2_dir() / "tokenizer.json").is_file()
