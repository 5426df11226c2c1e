"""MedTPE ids of an unchanged text prefix stay unchanged: `encode(a + b)` starts with
`encode(a)` except for the ids of `a`'s last pre-token and at most `merge_depth` ids before them
(the bound derived in `tests.support.prefix_stability`)."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.core.tokenizer.encoding import merge_depth
from tests.support.paths import ROOT
from tests.support.prefix_stability import last_pretoken_start, stable_prefix_length
from tests.support.tokenizer_support import (
    MIXED_TEXT,
    icu_records,
    small_medtpe,
    smollm2_dir,
    smollm2_medtpe,
)

DEFAULT_ARTEFACT = ROOT / "artefacts" / "smollm2-135m-icu"
RECORD_LINES = st.lists(st.sampled_from(icu_records(2, seed=3)[0].splitlines()), max_size=8).map(
    "\n".join
)
# record-like text, and text dense in what pre-tokenization treats specially at a boundary:
# spaces before words, runs of whitespace, digits, apostrophes, byte-fallback characters
TEXT = st.one_of(
    MIXED_TEXT,
    RECORD_LINES,
    st.text(st.sampled_from(list(" \n\t'sdtlm1209.:-[]aZé°中\x04\U00040000")), max_size=30),
)


@cache
def default_medtpe() -> MedTPETokenizer:
    """The committed default artefact on SmolLM2's real tokenizer."""
    return MedTPETokenizer.load(DEFAULT_ARTEFACT, base=smollm2_dir())


@cache
def with_plain_tail() -> MedTPETokenizer:
    """The SmolLM2 BPE n3 build with a plain tail of 6 ids (made once, not once per example)."""
    return smollm2_medtpe("bpe", 3).with_settings(plain_tail=6)


TOKENIZERS = {
    "default artefact": default_medtpe,
    "smollm2 bpe n3": lambda: smollm2_medtpe("bpe", 3),
    "small bpe n3": lambda: small_medtpe("bpe", 3),
    "smollm2 bpe n3, plain tail 6": with_plain_tail,
}


@pytest.mark.parametrize("name", TOKENIZERS)
@given(a=TEXT, b=TEXT)
def test_appending_text_keeps_all_but_the_last_ids(name, a, b):
    tokenizer = TOKENIZERS[name]()
    k = stable_prefix_length(tokenizer, a)
    assert tokenizer.encode(a + b)[:k] == tokenizer.encode(a)[:k]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_the_bound_is_short_on_records(name):
    """On a record growing line by line, only a handful of ids fall outside the bound."""
    tokenizer = TOKENIZERS[name]()
    lines = icu_records(1, seed=11)[0].splitlines()
    depth = merge_depth(tokenizer.merges)
    for n in range(5, len(lines), 7):
        a = "\n".join(lines[:n])
        unstable = len(tokenizer.encode(a)) - stable_prefix_length(tokenizer, a)
        last = tokenizer.encode(a[last_pretoken_start(tokenizer, a) :])
        assert unstable <= len(last) + depth + 1 + tokenizer.plain_tail
        assert unstable - tokenizer.plain_tail <= 12


def test_the_last_ids_can_change():
    """The bound is not slack: appending to a's last word re-segments it."""
    tokenizer = default_medtpe().with_settings(plain_tail=0)
    a, b = "Heart Rate: 80 bpm\nRespiratory Rate: 1", "8 insp/min"
    ids_a, ids_ab = tokenizer.encode(a), tokenizer.encode(a + b)
    assert ids_ab[: len(ids_a)] != ids_a
    k = stable_prefix_length(tokenizer, a)
    assert ids_ab[:k] == ids_a[:k] and k > 0
