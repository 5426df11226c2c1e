"""Task registry: the built-in tasks (`*.yaml` beside this file) plus user task files.

A user adds a task without code: a YAML or JSON file with the fields of `Task`, either loaded
with `load_task_file(path)` or placed in a directory named by `MEDTPE_TASKS_DIR` (several
directories separated by the OS path separator; read once per process). A user task with a
built-in task's name replaces it.

Modules: `task` (`Task` and its predictions), `answers` (the answer contract: where an answer
ends and how it parses), `option_probabilities` (the answer options' probabilities).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from medtpe.core.tasks.task import ParsedAnswer, Prediction, Task

TASKS_DIR_ENV = "MEDTPE_TASKS_DIR"
_BUILTIN_DIR = Path(__file__).resolve().parent
_SUFFIXES = (".yaml", ".yml", ".json")

__all__ = [
    "TASKS_DIR_ENV",
    "ParsedAnswer",
    "Prediction",
    "Task",
    "TaskFileError",
    "UnknownTaskError",
    "answers",
    "get_task",
    "list_tasks",
    "load_task_file",
    "option_probabilities",
]


class UnknownTaskError(LookupError):
    """No task of that name is registered."""


class TaskFileError(ValueError):
    """A task file cannot be read or does not describe a valid task."""


def load_task_file(path: str | Path) -> Task:
    """Read and validate one task file (YAML or JSON)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, json.JSONDecodeError, yaml.YAMLError) as exc:
        raise TaskFileError(f"{path}: cannot read task file ({exc})") from exc
    if not isinstance(data, dict):
        raise TaskFileError(f"{path}: a task file holds a mapping of task fields")
    try:
        return Task.model_validate(data)
    except ValidationError as exc:
        raise TaskFileError(f"{path}: invalid task: {exc}") from exc


def _task_dirs(extra: str) -> list[Path]:
    return [_BUILTIN_DIR, *(Path(p).expanduser() for p in extra.split(os.pathsep) if p)]


def _registry() -> dict[str, Task]:
    return _load_registry(os.environ.get(TASKS_DIR_ENV, ""))


@functools.lru_cache(maxsize=8)
def _load_registry(extra_dirs: str) -> dict[str, Task]:
    """Tasks of the built-in and `extra_dirs` directories, read once per process and setting."""
    tasks: dict[str, Task] = {}
    for directory in _task_dirs(extra_dirs):
        if not directory.is_dir():
            raise TaskFileError(f"{TASKS_DIR_ENV} names {directory}, which is not a directory")
        for path in sorted(p for p in directory.iterdir() if p.suffix in _SUFFIXES):
            task = load_task_file(path)
            tasks[task.name] = task
    return tasks


def list_tasks() -> list[str]:
    """Names of all registered tasks, sorted."""
    return sorted(_registry())


def get_task(name: str) -> Task:
    """The task called `name`; `UnknownTaskError` lists the known ones otherwise."""
    tasks = _registry()
    if name not in tasks:
        raise UnknownTaskError(f"unknown task {name!r}; known tasks: {', '.join(sorted(tasks))}")
    return tasks[name]
