"""The columnar renderer against a frozen copy of the per-event renderer
(tests/support/render_reference.py) on generated records: text values with newlines and stray
whitespace, duplicates, seconds, static events, descriptions with odd spacing, every budget — with
an encoder whose lines compose (SmolLM2) and one whose lines do not (the record is then encoded
whole)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medtpe.core.meds import MedsEvent, SubjectEvents
from medtpe.core.prompt.piece_tokens import piece_tokens
from medtpe.core.prompt.render import BudgetTooSmallError, render_record
from medtpe.core.tokenizer import BaseTokenizer
from tests.support import render_reference
from tests.support.properties import examples
from tests.support.tokenizer_support import smollm2_dir

DESCRIPTIONS = {
    "LAB//220045//bpm": "Heart Rate [bpm]",
    "LAB//50912//mg/dL": "Creatinine (Blood) [mg/dL]",
    "NOTE//1": "  Nursing note ",
    "NOTE//2": "",
    "DIAGNOSIS//ICD//9//4019": "Diagnosis: Unspecified essential hypertension",
}
CODES = [*DESCRIPTIONS, "MEDS_BIRTH", "MEDS_DEATH", "GENDER//F", "LAB//220179//mmHg", "X"]
T0 = datetime(2150, 1, 1, 8)


class PrefixSpaceEncoder:
    """SmolLM2 with a space put before every text (as `add_prefix_space` tokenizers do): lines
    encoded one by one do not add up to the record's ids."""

    def __init__(self, base: BaseTokenizer) -> None:
        self.base = base

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of " " + each text."""
        return self.base.encode_batch([" " + t for t in texts])


@pytest.fixture(scope="module")
def smollm2() -> BaseTokenizer:
    return BaseTokenizer.load(smollm2_dir())


@pytest.fixture(scope="module")
def prefix_space(smollm2: BaseTokenizer) -> PrefixSpaceEncoder:
    """One `PrefixSpaceEncoder` for every example, as a served encoder is one object: the
    renderer finds its piece tokens once (`piece_tokens` keeps them by encoder)."""
    return PrefixSpaceEncoder(smollm2)


_TEXTS = st.one_of(
    st.none(),
    st.sampled_from(["<0.01", "Yellow", " padded ", "two\nlines", "\n", "", "  ", "ü ß 中"]),
    st.text(max_size=6),
)


@st.composite
def records(draw: st.DrawFn) -> tuple[SubjectEvents, datetime | None]:
    """A subject's events (times on a few timestamps, some static) and a prediction time."""
    events = []
    for _ in range(draw(st.integers(0, 40))):
        minutes = draw(st.integers(0, 4 * 24 * 60).map(lambda m: m - m % 17))
        time = None if not draw(st.integers(0, 9)) else T0 + timedelta(minutes=minutes)
        if time is not None and not draw(st.integers(0, 5)):
            time += timedelta(seconds=draw(st.integers(1, 59)))
        events.append(
            MedsEvent(
                subject_id=1,
                time=time,
                code=draw(st.sampled_from(CODES)),
                numeric_value=draw(st.none() | st.sampled_from([80.0, 1.25, 0.5, -3.0, 1e20])),
                text_value=draw(_TEXTS),
            )
        )
    when = draw(st.none() | st.just(T0 + timedelta(days=2)))
    return SubjectEvents.from_events(events), when


def _outcome(render, events, when, encoder, budget):
    try:
        r = render(events, DESCRIPTIONS, when, encoder, budget)
    except BudgetTooSmallError:
        return "too small"
    return r.text, r.n_tokens, r.n_events_total, r.n_events_kept


@settings(max_examples=examples(150))
@given(records(), st.one_of(st.none(), st.integers(1, 600)), st.booleans())
def test_columnar_renderer_matches_the_per_event_one(
    smollm2, prefix_space, record, budget, composes
) -> None:
    events, when = record
    encoder = smollm2 if composes else prefix_space
    assert piece_tokens(encoder).composes is composes
    new = _outcome(render_record, events, when, encoder, budget)
    assert new == _outcome(render_reference.render_record, events, when, encoder, budget)
    if new != "too small":
        rendered = render_record(events, DESCRIPTIONS, when, encoder, budget)
        assert rendered.ids == encoder.encode_batch([rendered.text])[0]
