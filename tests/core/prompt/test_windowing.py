"""Window policies: the stable window starts on a grid boundary, keeps its start (and the text
before the newest events) while the record grows, and costs fewer events than one grid cell."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import meds
import numpy as np
import pytest

from medtpe.core.meds import MedsDataset
from medtpe.core.prompt import Prompt, build_prompt
from medtpe.core.prompt.windowing import Windowing, WindowPolicy, stable_starts
from medtpe.core.tokenizer import BaseTokenizer
from medtpe.core.tokenizer.encoding import merge_depth
from tests.support.meds_fixtures import T0, write_meds_dataset
from tests.support.paths import FIXTURES
from tests.support.prefix_stability import last_pretoken_start
from tests.support.tokenizer_support import smollm2_dir, smollm2_medtpe

SMOLLM2_DIR = FIXTURES / "smollm2"
BUDGET = 700
STABLE = Windowing(WindowPolicy.STABLE, grid_hours=6)
HOURS = [T0 + timedelta(hours=h, minutes=40) for h in range(40, 52)]
"""Hourly re-scores of a growing record (an event every hour at :30)."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return MedsDataset.load(write_meds_dataset(tmp_path_factory.mktemp("meds"), (1,), hours=60))


def prompt_at(dataset, tokenizer, template, when: datetime, windowing: Windowing) -> Prompt:
    return build_prompt(
        "icu_mortality",
        dataset.events(1),
        when,
        tokenizer,
        template,
        BUDGET,
        dataset.descriptions,
        windowing=windowing,
    )


def shown_times(prompt: Prompt) -> list[str]:
    return [line for line in prompt.record_text.splitlines() if line.startswith("[2")]


def test_grid_hours_must_be_positive():
    with pytest.raises(ValueError, match="grid_hours"):
        Windowing(WindowPolicy.STABLE, grid_hours=0)


def test_stable_window_starts_on_a_grid_boundary(dataset, tokenizer, template):
    for when in HOURS:
        sliding = prompt_at(dataset, tokenizer, template, when, Windowing())
        stable = prompt_at(dataset, tokenizer, template, when, STABLE)
        assert stable.n_tokens_original <= BUDGET
        assert stable.n_events_kept < stable.n_events_total
        # the first shown group is the first at or after a 6-hour boundary (00, 06, 12, 18 h)
        first = datetime.strptime(shown_times(stable)[0], "[%Y-%m-%d %H:%M]")
        boundary = first.replace(minute=0, hour=first.hour // 6 * 6)
        assert first - boundary < timedelta(hours=1)  # the fixture has an event every hour
        # the price: fewer events than the sliding window, by less than one grid cell's worth
        assert 0 < sliding.n_events_kept - stable.n_events_kept <= 6 * 4


def test_stable_prompt_text_grows_only_at_its_end(dataset, tokenizer, template):
    prompts = [prompt_at(dataset, tokenizer, template, when, STABLE) for when in HOURS]
    moves = 0
    for previous, current in itertools.pairwise(prompts):
        kept_start = shown_times(previous)[0] == shown_times(current)[0]
        if kept_start:
            # age, omission line, statics, headers and events before the newest: unchanged
            assert current.text.startswith(previous.head + previous.record_text)
        else:
            moves += 1
    assert 1 <= moves <= len(HOURS) // 6 + 1  # the start moves about once per grid cell


def test_sliding_prompt_changes_its_beginning(dataset, tokenizer, template):
    prompts = [prompt_at(dataset, tokenizer, template, when, Windowing()) for when in HOURS[:3]]
    for previous, current in itertools.pairwise(prompts):
        assert not current.text.startswith(previous.head + previous.record_text)


def test_whole_record_is_the_same_under_both_policies(dataset, tokenizer, template):
    when = T0 + timedelta(hours=3)
    sliding = prompt_at(dataset, tokenizer, template, when, Windowing())
    stable = prompt_at(dataset, tokenizer, template, when, STABLE)
    assert sliding.n_events_kept == sliding.n_events_total
    assert stable.text == sliding.text


def test_stable_starts(dataset):
    events = dataset.events(1).before(HOURS[0])
    assert list(stable_starts(events, len(events), 6)) == []  # everything fits
    n_static = int(np.isnat(events.times).sum())
    kept_timed = 30  # the newest 30 timed events: first kept at hour 28 (a 4-event hour)
    starts = list(stable_starts(events, n_static + kept_timed, 6))
    first_kept = events.times[len(events) - kept_timed].astype(datetime)
    assert starts[0] >= first_kept and starts[0] - first_kept < timedelta(hours=6)
    assert all(s.hour % 6 == 0 and s.minute == 0 for s in starts)
    assert starts == [starts[0] + timedelta(hours=6 * k) for k in range(len(starts))]


def test_stable_window_medtpe_ids_shared_between_rescores(dataset, template):
    """The MedTPE ids of a re-score repeat the previous prompt's up to its newest events: all
    but the record's last pre-token and `merge_depth` ids (tests.support.prefix_stability)."""
    tokenizer = smollm2_medtpe("bpe", 3)
    base = tokenizer.base
    depth = merge_depth(tokenizer.merges)
    assert depth >= 2

    def at(when: datetime) -> Prompt:
        return build_prompt(
            "icu_mortality",
            dataset.events(1),
            when,
            base,
            template,
            900,
            dataset.descriptions,
            windowing=STABLE,
        )

    shared_any = False
    for previous, current in zip(map(at, HOURS), map(at, HOURS[1:]), strict=False):
        if not current.text.startswith(previous.head + previous.record_text):
            continue  # the window moved
        shared_any = True
        head_len = last_pretoken_start(tokenizer, previous.record_text)
        stable_base = previous.head_ids + base.encode(previous.record_text[:head_len])
        bound = len(tokenizer.encode_ids(stable_base)) - depth
        a, b = previous.medtpe_ids(tokenizer), current.medtpe_ids(tokenizer)
        assert a[:bound] == b[:bound]
        # all but a few ids of the previous prompt's head and record
        assert bound >= len(tokenizer.encode_ids(previous.head_ids + previous.record_ids)) - 6
    assert shared_any


def test_stable_window_age_is_given_at_the_window_start(dataset, tokenizer, template):
    stable = prompt_at(dataset, tokenizer, template, HOURS[0], STABLE)
    assert stable.record_text.startswith("Age: 60 years\n(")
    assert "earlier events omitted)" in stable.record_text.splitlines()[1]


def test_base_tokenizer_is_enough_for_the_stable_window(dataset, template):
    """The window is chosen on original tokens: any base tokenizer, here SmolLM2's real one."""
    base = BaseTokenizer.load(smollm2_dir())
    prompt = build_prompt(
        "icu_mortality",
        dataset.events(1),
        HOURS[-1],
        base,
        template,
        BUDGET,
        dataset.descriptions,
        windowing=STABLE,
    )
    assert prompt.n_tokens_original <= BUDGET and prompt.n_events_kept < prompt.n_events_total


def bounded(events, when: datetime, last: int, birth: bool):
    """What a client that sends its last `last` events up to `when` sends (static ones too, and
    with `birth` the birth event, which gives the age)."""
    times = events.times
    cutoff = np.datetime64(when, "us")
    timed = np.flatnonzero(~np.isnat(times) & (times <= cutoff))
    keep = np.isnat(times)
    keep[timed[-last:]] = True
    if birth:
        keep |= np.array([code == meds.birth_code for code in events.codes])
    return events.take(keep)


@pytest.mark.parametrize(("last", "birth"), [(30, True), (45, True), (30, False)])
def test_bounded_histories_give_stable_prompts(dataset, tokenizer, template, last, birth):
    """A client that sends only its last N events (with the birth event: the whole record's
    prompt whenever the window starts after its first event): its re-scores reuse each other's
    prompt up to the newest events while the window stays."""
    whole, reused, same = [], 0, 0
    for when in HOURS:
        full = prompt_at(dataset, tokenizer, template, when, STABLE)
        part = build_prompt(
            "icu_mortality",
            bounded(dataset.events(1), when, last, birth),
            when,
            tokenizer,
            template,
            BUDGET,
            dataset.descriptions,
            windowing=STABLE,
        )
        assert part.n_events_total < full.n_events_total
        if birth and part.n_events_kept == full.n_events_kept:
            assert part.text == full.text
            assert "(earlier events omitted)" in part.record_text.splitlines()[1]
            same += 1
        whole.append(part)
    for previous, current in itertools.pairwise(whole):
        if current.text.startswith(previous.head + previous.record_text):
            reused += 1
    assert reused >= len(HOURS) // 2  # the window moves only every grid cell
    assert same >= len(HOURS) // 2 if birth else same == 0
