"""The prompt layouts: `record-first` prompts of several tasks about one record share their ids
up to the end of the record, under both tokenizers; `task-first` is the layout of old receipts."""

from __future__ import annotations

import pytest

from medtpe.core.meds import MedsDataset
from medtpe.core.prompt import PromptLayout, build_prompt, build_prompts
from medtpe.core.prompt.layout import RECORD_FIRST_FRAMING, user_message
from medtpe.core.tasks import get_task, list_tasks
from tests.support.meds_fixtures import PREDICTION_TIME, write_meds_dataset
from tests.support.tokenizer_support import smollm2_medtpe

TASKS = ["icu_mortality", "phenotyping", "readmission_30d", "pancreatic_cancer_1y"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return MedsDataset.load(write_meds_dataset(tmp_path_factory.mktemp("meds")))


@pytest.fixture(scope="module")
def medtpe():
    return smollm2_medtpe(method="bpe", max_n=4)


@pytest.fixture(scope="module")
def tokenizer(medtpe):
    return medtpe.base


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_record_first_prompts_share_everything_up_to_the_record_end(
    dataset, tokenizer, template, medtpe
):
    prompts = build_prompts(
        TASKS, dataset.events(1), PREDICTION_TIME, tokenizer, template, 1200, dataset.descriptions
    )
    first = prompts[0]
    assert first.n_events_kept < first.n_events_total  # the budget cut the record
    medtpe_ids = [p.medtpe_ids(medtpe) for p in prompts]
    shared = first.shared_medtpe_ids(medtpe)
    for prompt, ids in zip(prompts, medtpe_ids, strict=True):
        assert prompt.layout is PromptLayout.RECORD_FIRST
        assert prompt.shared_ids == first.shared_ids and prompt.n_tokens_original <= 1200
        assert prompt.shell_tokens == max(len(p.head_ids) + len(p.tail_ids) for p in prompts)
        assert ids[: len(shared)] == shared
        assert medtpe.decode(ids) == prompt.text  # lossless
        assert prompt.text.startswith(first.head) and RECORD_FIRST_FRAMING in prompt.head
    for other in medtpe_ids[1:]:  # the tails part after it (their first words may agree)
        assert len(shared) <= _common(medtpe_ids[0], other) < len(other)
    assert len(shared) < len(first.shared_ids)  # the shared part is compressed


def test_a_task_asked_with_others_gets_its_single_prompt_at_the_same_reserve(
    dataset, tokenizer, template
):
    events = dataset.events(1)
    together = build_prompts(TASKS, events, PREDICTION_TIME, tokenizer, template, 1200)
    for task, prompt in zip(TASKS, together, strict=True):
        alone = build_prompt(
            task, events, PREDICTION_TIME, tokenizer, template, 1200,
            shell_tokens=prompt.shell_tokens,
        )  # fmt: skip
        assert alone.base_ids == prompt.base_ids
    phenotyping = build_prompt("phenotyping", events, PREDICTION_TIME, tokenizer, template, 1200)
    assert phenotyping.base_ids == together[1].base_ids  # the longest tail sets the reserve
    mortality = build_prompt("icu_mortality", events, PREDICTION_TIME, tokenizer, template, 1200)
    assert len(mortality.record_ids) > len(together[0].record_ids)  # alone: more record


def test_task_first_keeps_the_instruction_first(dataset, tokenizer, template, medtpe):
    prompts = build_prompts(
        TASKS, dataset.events(1), PREDICTION_TIME, tokenizer, template, 1200,
        layout=PromptLayout.TASK_FIRST,
    )  # fmt: skip
    for task, prompt in zip(TASKS, prompts, strict=True):
        assert get_task(task).instruction in prompt.head and prompt.shell_tokens is None
        assert medtpe.decode(prompt.medtpe_ids(medtpe)) == prompt.text
    assert _common(prompts[0].base_ids, prompts[1].base_ids) < len(prompts[0].head_ids)


@pytest.mark.parametrize("name", list_tasks())
def test_the_record_first_head_names_no_task(name):
    task = get_task(name)
    message = user_message(PromptLayout.RECORD_FIRST, task, "RECORD", "2150-01-01 08:00")
    head = message.split("RECORD")[0]
    assert task.question not in head and task.title not in head
    assert message.endswith(f"{task.question}\n{task.answer_format()}")
    assert (task.instruction_after_record or task.instruction) in message.split("RECORD")[1]
    assert user_message(PromptLayout.TASK_FIRST, task, "RECORD") == task.user_message("RECORD")
