"""`medtpe_core.snippets.plain_tail` (`bench_fidelity diagnose --plain-tail`, distillation with
`unmerged_tail`): the last K original tokens left unmerged, the rest encoded as MedTPE does,
decodes to the same text, on arbitrary Unicode; a snippet cut so ends on the original ids."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from medtpe_core.snippets import cut, plain_tail
from tests.support.properties import examples
from tests.support.tokenizer_support import smollm2_medtpe

TOKENIZER = smollm2_medtpe()
ICU_LINE = "08:00 Heart Rate [bpm] 84; O2 saturation pulseoxymetry [%] 97\n"


@given(st.text(max_size=200), st.integers(min_value=0, max_value=400))
@settings(max_examples=examples(200), deadline=None)
def test_a_plain_tail_is_the_same_text_and_merges_only_before_it(text: str, k: int) -> None:
    original = TOKENIZER.base_encode(ICU_LINE * 3 + text)
    ids = plain_tail(TOKENIZER, original, k)
    assert TOKENIZER.decode(ids) == TOKENIZER.base.decode(original)
    unmerged = TOKENIZER.encode_ids(original, merge=False)  # evicted tokens split, no merge
    assert not set(unmerged) & {t.id for t in TOKENIZER.new_tokens}
    assert TOKENIZER.decode(unmerged) == TOKENIZER.base.decode(original)
    assert plain_tail(TOKENIZER, original, 0) == TOKENIZER.encode_ids(original)
    assert plain_tail(TOKENIZER, original, len(original)) == unmerged
    tail = TOKENIZER.encode_ids(original[max(len(original) - k, 0) :], merge=False)
    assert ids[len(ids) - len(tail) :] == tail  # the end in the base model's tokens


def test_a_last_snippet_with_an_unmerged_tail_ends_on_the_original_ids() -> None:
    original = TOKENIZER.base_encode(ICU_LINE * 12)
    merged = cut(TOKENIZER, original, 64, tail=True)[-1]
    plain = cut(TOKENIZER, original, 64, tail=True, unmerged_tail=40)[-1]
    assert plain.teacher == merged.teacher and plain.student[-40:] == original[-40:]
    assert len(plain.student) > len(merged.student) and len(plain.pairs) > len(merged.pairs)
    assert plain.pairs[-1] == (len(plain.student) - 1, len(plain.teacher) - 1)
