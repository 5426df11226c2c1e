"""`min_input_tokens`: the smallest input budget with which every task's prompt holds any record
(the service refuses to start below it)."""

from __future__ import annotations

from datetime import datetime

import meds
import numpy as np
import pytest

from medtpe.core.meds.events import MAX_EVENTS_PER_RECORD, MedsEvent, SubjectEvents
from medtpe.core.prompt import ChatTemplate
from medtpe.core.prompt.render import BudgetTooSmallError
from medtpe.core.prompt.task_prompt import build_prompt, min_input_tokens
from medtpe.core.tasks import list_tasks
from medtpe.core.tokenizer import BaseTokenizer
from tests.support.service_support import synthetic_events
from tests.support.tokenizer_support import smollm2_dir

LATEST = datetime(9999, 12, 31, 23, 59, 59)


@pytest.fixture(scope="module")
def base() -> BaseTokenizer:
    return BaseTokenizer.load(smollm2_dir())


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate.from_model_dir(smollm2_dir())


def longest_record() -> SubjectEvents:
    """The most events a request may hold, born in the year 1: the longest age and omission
    lines at a prediction time in 9999."""
    n = MAX_EVENTS_PER_RECORD
    times = np.full(n, np.datetime64("0001-01-01T00:00:00", "us"))
    codes = [meds.birth_code] + ["LAB//220045//bpm"] * (n - 1)
    return SubjectEvents.from_columns(1, times, codes, np.full(n, 80.0), [None] * n)


def test_the_minimum_is_the_smallest_budget_the_longest_record_fits(base, template) -> None:
    per_task = {task: min_input_tokens(base, template, [task]) for task in list_tasks()}
    assert min_input_tokens(base, template) == max(per_task.values())
    record = longest_record()
    for task, minimum in per_task.items():
        prompt = build_prompt(task, record, LATEST, base, template, minimum)
        assert prompt.n_events_kept == 0 and prompt.n_tokens_original <= minimum
        assert f"({MAX_EVENTS_PER_RECORD:,} earlier events omitted)" in prompt.record_text
        with pytest.raises(BudgetTooSmallError, match="max_input_tokens"):
            build_prompt(task, record, LATEST, base, template, minimum - 1)


def test_every_record_fits_the_minimum(base, template) -> None:
    minimum = min_input_tokens(base, template)
    events = [MedsEvent.model_validate(e) for e in synthetic_events(3, 400)]
    for task in list_tasks():
        for when in (None, events[-1].time):
            prompt = build_prompt(task, events, when, base, template, minimum)
            assert prompt.n_tokens_original <= minimum
