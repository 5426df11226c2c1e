"""Where the record sits in a task's user turn: the prompt layout, a named and versioned rendering
setting (it enters the rendering settings a receipt signs, so a receipt re-derives under its own).

- `record-first.v1` (the default): a head that names no task (`RECORD_FIRST_FRAMING`), the record,
  then the task's instruction, options, prediction time, question and answer form. Every task
  asked of one record at one prediction time has the same ids up to the end of the record, so an
  engine with prefix caching reads the record once for all of them.
- `task-first.v1`: the task's instruction and options, the record, then the prediction time,
  question and answer form (`Task.user_message`): each task's prompt differs from its start.

    >>> from medtpe.core.tasks import get_task
    >>> user_message(PromptLayout.RECORD_FIRST, get_task("icu_mortality"), "Age: 71").startswith(
    ...     RECORD_FIRST_FRAMING)
    True
"""

from __future__ import annotations

from enum import StrEnum

from medtpe.core.tasks import Task


class PromptLayout(StrEnum):
    """The prompt layouts, each named with its version."""

    RECORD_FIRST = "record-first.v1"
    TASK_FIRST = "task-first.v1"


DEFAULT_LAYOUT = PromptLayout.RECORD_FIRST
"""The layout prompts are built in unless a caller names another."""

LEGACY_LAYOUT = PromptLayout.TASK_FIRST
"""The layout of rendering settings that name none (written before layouts were named)."""

RECORD_FIRST_FRAMING = (
    "You are a clinical prediction assistant. Below is the electronic health record of a "
    "patient, with everything recorded until the prediction time. A prediction task about the "
    "patient follows the record."
)
"""The `record-first` user turn's opening: the same for every task."""


def user_message(
    layout: PromptLayout, task: Task, record_text: str, prediction_time: str | None = None
) -> str:
    """The user turn of `task` about `record_text` in `layout`."""
    if layout is PromptLayout.TASK_FIRST:
        return task.user_message(record_text, prediction_time)
    parts = [RECORD_FIRST_FRAMING, f"Patient record:\n{record_text}"]
    parts.append(task.instruction_after_record or task.instruction)
    parts += task.options_block() + task.closing(prediction_time)
    return "\n\n".join(parts)
