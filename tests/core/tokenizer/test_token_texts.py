"""Each id's own text in one call (`decode_each`, behind `tokens` and the stop rule's
`answer_end_ids`) is `decode([i])` of every id: on the base tokenizer, a replacement artefact
with byte fallback (the default one), and an extension artefact whose fresh ids lie past the base
vocabulary."""

from __future__ import annotations

import pytest

from medtpe.core.tokenizer import MedTPETokenizer
from tests.support.paths import ROOT
from tests.support.tokenizer_support import smollm2_extension, smollm2_medtpe

DEFAULT_ARTEFACT = ROOT / "artefacts" / "smollm2-135m-icu"


@pytest.mark.parametrize("name", ["default artefact", "extension"])
def test_each_ids_text_in_one_call_is_its_own_decoding(name: str) -> None:
    tok = MedTPETokenizer.load(DEFAULT_ARTEFACT) if name == "default artefact" else None
    tok = tok or smollm2_extension("bpe", 3)
    ids = list(range(tok.vocab_size))
    each = [tok.decode([i]) for i in ids]
    assert tok.decode_each(ids) == each
    assert tok.tokens(ids[::-1]) == each[::-1]
    if name == "default artefact":
        assert tok.byte_fallback  # its fallback ids decode through the byte decoder


def test_a_vocabulary_s_texts_are_shared_by_its_loads_and_kept_apart_from_others() -> None:
    """Each id's text is found once per vocabulary in a process (every model load reads all of
    them for the stop rule): a second load of the default artefact reads the first's, and two
    artefacts on the same base with other merges never read each other's."""
    first = MedTPETokenizer.load(DEFAULT_ARTEFACT)
    ids = list(range(first.vocab_size))
    texts = first.tokens(ids)
    again = MedTPETokenizer.load(DEFAULT_ARTEFACT).with_settings(plain_tail=4)
    assert again.tokens(ids) == texts and again._shared is first._shared
    for other in (smollm2_medtpe("bpe", 3), smollm2_extension("bpe", 3)):
        assert other._shared is not first._shared
        mine = list(range(other.vocab_size))
        assert other.tokens(mine) == [other.decode([i]) for i in mine] != texts[: len(mine)]
