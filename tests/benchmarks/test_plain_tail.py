"""`bench_fidelity diagnose --plain-tail`: the prompt's last K original tokens left unmerged,
the rest encoded as MedTPE does, decodes to the same text, on arbitrary Unicode."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.bench_fidelity import plain_tail
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
    tail = original[max(len(original) - k, 0) :]
    assert ids[len(ids) - len(tail) :] == tail  # the tail as the original reads it
    assert plain_tail(TOKENIZER, original, 0) == TOKENIZER.encode_ids(original)
    assert plain_tail(TOKENIZER, original, len(original)) == original
