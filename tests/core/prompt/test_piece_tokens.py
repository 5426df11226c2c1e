"""A record's ids joined from its lines' cached ids (`PieceTokens.join`) are the ids of its text
encoded whole, also when lines start or end with whitespace or are empty (such a line is encoded
together with its neighbours: `joined_pieces`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medtpe.core.prompt.piece_tokens import PieceTokens, joined_pieces
from medtpe.core.tokenizer import BaseTokenizer
from tests.support.properties import examples
from tests.support.tokenizer_support import smollm2_dir


@pytest.fixture(scope="module")
def pieces() -> PieceTokens:
    tokens = PieceTokens(BaseTokenizer.load(smollm2_dir()))
    assert tokens.composes
    return tokens


_LINES = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "Heart Rate: 80 bpm",
                "[2150-01-01 08:00]",
                "[08:17]",
                "Medication: START PHENObarbital ",
                " Replacement (Critical Care) ",
                "",
                " ",
                "\t",
                "x\u2028",
                "Note: two  spaces",
            ]
        ),
        st.text(max_size=5),
    ),
    max_size=8,
)


@settings(max_examples=examples(300))
@given(_LINES)
def test_joined_ids_are_the_whole_texts(pieces: PieceTokens, lines: list[str]) -> None:
    text = "\n".join(lines)
    assert "".join(joined_pieces(lines)) == text
    assert pieces.join(lines) == pieces.encoder.encode_batch([text])[0]


def test_a_line_is_glued_on_the_sides_where_it_has_whitespace() -> None:
    lines = ["[08:00]", "Drug: A ", "Heart Rate: 80 bpm", "", "[09:00]", "Urine: Yellow", " x"]
    assert joined_pieces(lines) == [
        "[08:00]\n",
        "Drug: A \nHeart Rate: 80 bpm\n\n[09:00]\n",
        "Urine: Yellow\n x",
    ]
