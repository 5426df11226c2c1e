"""Which task or tasks a request body asks (`/predict`, `/tokenize`): the task names the service
knows (`TASK_NAMES`), the caps on a `task` and on a `tasks` list, the JSON schema of the two
optional fields and of a body that names one of them (`TASK_OR_TASKS`), and the check that it
names exactly one, without a name twice (`check_task_choice`). Optional fields are left out when
unused, never null (`left_out_not_null`: their JSON schema)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from medtpe.core.tasks import list_tasks

TASK_NAMES = list_tasks()
MAX_TASK_CHARS = 64
"""Longest task name accepted (`task`, each of `tasks`); the names themselves are shorter."""
MAX_TASKS_PER_RECORD = 8
"""Most task names one record's `tasks` may hold (each at most once)."""
_TASK_FIELD = {"enum": TASK_NAMES}


def left_out_not_null(schema: dict[str, Any]) -> None:
    """JSON schema of an optional field that is left out when unused, never sent as null."""
    branches = [b for b in schema.pop("anyOf", []) if b.get("type") != "null"]
    if branches:
        schema.update(branches[0])


def optional_task(schema: dict[str, Any]) -> None:
    """JSON schema of an optional `task`: left out when unused, one of the task names."""
    left_out_not_null(schema)
    schema.update(_TASK_FIELD)


def task_list(schema: dict[str, Any]) -> None:
    """JSON schema of an optional `tasks`: left out when unused, distinct task names."""
    left_out_not_null(schema)
    schema["uniqueItems"] = True
    schema["items"].update(_TASK_FIELD)


TaskNames = Annotated[
    list[Annotated[str, Field(max_length=MAX_TASK_CHARS)]],
    Field(min_length=1, max_length=MAX_TASKS_PER_RECORD),
]
"""`tasks`: 1 to `MAX_TASKS_PER_RECORD` task names (each once: `check_task_choice`)."""
OptionalTask = Annotated[
    str | None, Field(max_length=MAX_TASK_CHARS, json_schema_extra=optional_task)
]
"""A body's optional `task` (give it the default None and a description)."""
OptionalTasks = Annotated[TaskNames | None, Field(json_schema_extra=task_list)]
"""A body's optional `tasks` in place of `task` (give it the default None and a description)."""
TASK_OR_TASKS: dict[str, Any] = {
    "anyOf": [
        {"required": ["task"], "not": {"required": ["tasks"]}},
        {"required": ["tasks"], "not": {"required": ["task"]}},
    ]
}
"""JSON schema of a body that names `task` or `tasks`, not both."""


def _located(
    loc: tuple[str | int, ...], type_: str, message: str, value: object
) -> ValidationError:
    """A request model's error at `loc` (below the model), with `type_` and `message`."""
    error = PydanticCustomError(type_, message)
    detail = InitErrorDetails(type=error, loc=loc, input=value)
    return ValidationError.from_exception_data("PredictRequest", [detail])


def check_task_choice(task: str | None, tasks: list[str] | None) -> None:
    """One of `task` and `tasks`, the latter without a name twice; else a request model's error
    at the field (`[..., 'tasks', i]` for the second of two equal names)."""
    if task is None and tasks is None:
        raise _located(("task",), "missing", "give `task` or `tasks`", None)
    if task is not None and tasks is not None:
        raise _located(("tasks",), "task_and_tasks", "give `task` or `tasks`, not both", None)
    first: dict[str, int] = {}
    for i, name in enumerate(tasks or ()):
        if name in first:
            message = f"`tasks` names this task twice (also at {first[name]})"
            raise _located(("tasks", i), "duplicate_task", message, name)
        first[name] = i
