"""The plain tail (`MedTPETokenizer.plain_tail`, the artefact setting `PLAIN_TAIL`): every
encoding's last K ids left unmerged, the rest merged as MedTPE does, on arbitrary Unicode (the
byte fallback's characters included): lossless, the end in the base model's own tokens, the same
in every encoding path (`encode`, `encode_batch`, `encode_parts`, a prompt's ids), kept by a
saved artefact and part of its id; a snippet cut so ends on the original ids."""

from __future__ import annotations

from datetime import datetime
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medtpe.core.meds import MedsEvent
from medtpe.core.prompt import ChatTemplate, build_prompt
from medtpe.core.tokenizer.medtpe_tokenizer import PLAIN_TAIL, MedTPETokenizer
from medtpe.core.tokenizer.snippets import cut
from tests.support.properties import examples
from tests.support.tokenizer_support import FALLBACK_CHARS, MIXED_TEXT, smollm2_dir, smollm2_medtpe

TOKENIZER = smollm2_medtpe()
NEW_IDS = {t.id for t in TOKENIZER.new_tokens}
ICU_LINE = "08:00 Heart Rate [bpm] 84; O2 saturation pulseoxymetry [%] 97\n"
TAILS = st.sampled_from([0, 1, 7, 64, 256, 400])


@cache
def with_tail(k: int) -> MedTPETokenizer:
    """The test tokenizer with the setting `plain_tail: k` (built once per k)."""
    return TOKENIZER.with_settings(plain_tail=k)


def unmerged(text: str) -> list[int]:
    """`text` in the base model's tokens (evicted ones split, fallback bytes spelled)."""
    return TOKENIZER.encode(text, plain_tail=10**9)


@given(MIXED_TEXT, TAILS)
@settings(max_examples=examples(100), deadline=None)
def test_a_plain_tail_is_lossless_and_merges_only_before_it(text: str, k: int) -> None:
    text = ICU_LINE * 3 + text
    tok = with_tail(k)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids == TOKENIZER.encode(text, plain_tail=k)
    plain = unmerged(text)
    assert not set(plain) & NEW_IDS and TOKENIZER.decode(plain) == text
    n = min(k, len(plain))
    assert ids[len(ids) - n :] == plain[len(plain) - n :]  # the end in the base model's tokens
    assert not set(ids[len(ids) - n :]) & NEW_IDS
    assert tok.encode(text, plain_tail=0) == TOKENIZER.encode(text)  # no tail: as before
    assert tok.encode_batch([text, ICU_LINE]) == [ids, tok.encode(ICU_LINE)]


@given(MIXED_TEXT, TAILS)
@settings(max_examples=examples(100), deadline=None)
def test_parts_and_base_ids_count_one_tail_over_the_whole(text: str, k: int) -> None:
    tok = with_tail(k)
    head = tok.base_encode("<|im_start|>user\n", special_tokens=True)
    tail = tok.base_encode(ICU_LINE + "<|im_end|>\n", special_tokens=True)
    parts = [head, ICU_LINE * 4 + text, tail]
    ids = tok.encode_parts(parts)
    whole = tok.base.decode(head) + ICU_LINE * 4 + text + tok.base.decode(tail)
    assert tok.decode(ids) == whole
    plain = tok.encode_parts(parts, plain_tail=10**9)
    assert not set(plain) & NEW_IDS and tok.decode(plain) == whole
    n = min(k, len(plain))
    assert ids[len(ids) - n :] == plain[len(plain) - n :]
    if not tok.needs_fallback(text):  # one base pass: merges may cross the parts
        original = head + tok.base_encode(ICU_LINE * 4 + text) + tail
        merged = tok.encode_ids(original)
        assert tok.decode(merged) == whole and merged[len(merged) - n :] == ids[len(ids) - n :]
        assert merged[: len(merged) - n] == tok.encode_ids(
            original[: len(original) - n], plain_tail=0
        )


@pytest.mark.parametrize("record_tail", ["", FALLBACK_CHARS])
def test_a_prompt_ends_in_the_base_models_tokens(record_tail: str) -> None:
    """`Prompt.medtpe_ids` with the setting: the chat template's end and the record's last
    lines unmerged, from the original ids or (a byte-fallback character) from the parts."""
    tok = TOKENIZER.with_settings(plain_tail=48)
    events = [
        MedsEvent(
            subject_id=1, time=datetime(2150, 1, 1, 8, k), code="LAB//HR", numeric_value=80 + k
        )
        for k in range(40)
    ] + [
        MedsEvent(
            subject_id=1, time=datetime(2150, 1, 1, 9), code="NOTE", text_value=f"x {record_tail}"
        )
    ]
    template = ChatTemplate.from_model_dir(smollm2_dir())
    prompt = build_prompt("icu_mortality", events, None, tok.base, template, 2048)
    ids = prompt.medtpe_ids(tok)
    assert tok.decode(ids) == prompt.text
    parts = [prompt.head_ids, prompt.record_text, prompt.tail_ids]
    plain = tok.encode_parts(parts, plain_tail=10**9)
    assert ids[-48:] == plain[-48:] and not set(ids[-48:]) & NEW_IDS
    assert len(ids) < len(plain)  # the rest still merged


def test_the_setting_is_saved_named_in_the_id_and_checked(tmp_path) -> None:
    tok = TOKENIZER.with_settings(plain_tail=256)
    tok.save(tmp_path)
    loaded = MedTPETokenizer.load(tmp_path)
    assert loaded.plain_tail == 256 and loaded.settings[PLAIN_TAIL] == 256
    assert loaded.artefact_id == tok.artefact_id != TOKENIZER.artefact_id
    assert TOKENIZER.with_settings(plain_tail=0).artefact_id == TOKENIZER.artefact_id
    for bad in (-1, 2.5, "256"):
        with pytest.raises(ValueError, match=PLAIN_TAIL):
            TOKENIZER.with_settings(plain_tail=bad)


def test_a_last_snippet_with_an_unmerged_tail_ends_on_the_original_ids() -> None:
    original = TOKENIZER.base_encode(ICU_LINE * 12)
    merged = cut(TOKENIZER, original, 64, tail=True)[-1]
    plain = cut(TOKENIZER, original, 64, tail=True, unmerged_tail=40)[-1]
    assert plain.teacher == merged.teacher and plain.student[-40:] == original[-40:]
    assert len(plain.student) > len(merged.student) and len(plain.pairs) > len(merged.pairs)
    assert plain.pairs[-1] == (len(plain.student) - 1, len(plain.teacher) - 1)
    own = cut(TOKENIZER.with_settings(plain_tail=40), original, 64, tail=True, unmerged_tail=None)
    assert own[-1] == plain
