"""`MedTPETokenizer.shared_ends`: the positions where a MedTPE encoding and the base encoding it
came from end at the same point of the text (what dense distillation aligns), over arbitrary
Unicode and arbitrary base ids (evicted ones included)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medtpe.core.tokenizer import MedTPETokenizer
from tests.support.properties import examples
from tests.support.tokenizer_support import MIXED_TEXT, REPLACEMENT_BUILDS

TOKENIZERS = {name: REPLACEMENT_BUILDS[name] for name in ("smollm2-static", "small-bpe3")}


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def tok(request: pytest.FixtureRequest) -> MedTPETokenizer:
    return TOKENIZERS[request.param]()


def _check_pairs(tok: MedTPETokenizer, base: list[int]) -> tuple[np.ndarray, np.ndarray]:
    ids = tok.encode_ids(base)
    i, j = tok.shared_ends(ids, base)
    assert len(i) == len(j) and (len(i) > 0) == (len(base) > 0)
    assert np.all(np.diff(i) > 0) and np.all(np.diff(j) > 0)
    if base:
        assert (i[-1], j[-1]) == (len(ids) - 1, len(base) - 1)
    every = max(1, len(i) // 16)  # decoding every prefix is quadratic: 16 spread over the text
    for a, b in list(zip(i.tolist(), j.tolist(), strict=True))[::every]:
        assert tok.decode(ids[: a + 1]) == tok.base.decode(base[: b + 1])
    return i, j


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=MIXED_TEXT)
def test_shared_ends_of_text(tok: MedTPETokenizer, text: str) -> None:
    base = tok.base_encode(text)
    i, _ = _check_pairs(tok, base)
    if not set(base) & tok.evicted.keys():  # merges only join whole base tokens
        assert i.tolist() == list(range(len(tok.encode_ids(base))))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_shared_ends_of_any_base_ids(tok: MedTPETokenizer, data: st.DataObject) -> None:
    """Evicted base ids (split into several MedTPE tokens) end inside no MedTPE token."""
    evicted = sorted(i for i in tok.evicted if i < tok.base.vocab_size)
    any_id = st.integers(0, tok.base.vocab_size - 1)
    base = data.draw(st.lists(st.one_of(any_id, st.sampled_from(evicted)), max_size=60))
    _check_pairs(tok, base)


def test_ids_of_other_base_ids_are_refused(tok: MedTPETokenizer) -> None:
    base = tok.base_encode("Heart rate 80 bpm, SpO2 97 %")
    with pytest.raises(ValueError, match="not the MedTPE encoding"):
        tok.shared_ends(tok.encode_ids(base), base[:-1])


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_original_positions(tok: MedTPETokenizer, data: st.DataObject) -> None:
    """Each MedTPE token sits where the base token its text ends in sits: at a shared end that
    is the shared base token itself, never going back, the last at the last base token; without
    evicted ids (whose parts share one position) every token has a position of its own."""
    evicted = sorted(i for i in tok.evicted if i < tok.base.vocab_size)
    any_id = st.integers(0, tok.base.vocab_size - 1)
    base = data.draw(st.lists(st.one_of(any_id, st.sampled_from(evicted)), min_size=1))
    ids = tok.encode_ids(base)
    positions = tok.original_positions(ids, base)
    i, j = tok.shared_ends(ids, base)
    assert positions[i].tolist() == j.tolist()
    assert np.all(np.diff(positions) >= 0) and positions[-1] == len(base) - 1
    if not set(base) & tok.evicted.keys():
        assert np.all(np.diff(positions) > 0)
