"""Every error a user can cause with the `medtpe` command is one line naming what to change,
never a traceback. Each command and subcommand of the group (enumerated from it: a new command
is covered as it is added) is run with an unknown option, then with each option it has given a
wrong value of its kind: a name from no list (a choice, a task; in a list of tasks, one
named twice too), a path that does not exist, a
directory that is not what the option reads, a malformed URL or Ray address, a number out of its
range or no number at all, a date that is none. Each is a usage error (exit status 2) raised as
the command line is read, before any dataset, model or engine loads: the command's usage, the
hint to `--help` and one `Error:` line naming the option."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from medtpe.cli.command_line import medtpe_command
from medtpe.cli.main import cli
from medtpe.cli.options import HoldingPath, TaskName, TaskNames, Url
from medtpe.cli.ray_option import RayAddress
from medtpe.core.tasks import list_tasks

HEAVY = ("torch", "vllm", "transformers")
"""Libraries an error of the command line must not get as far as importing."""
SECRET = "s3cret-pw"
"""The password of the malformed URLs: a message never repeats it."""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No `MEDTPE_*` variable of the caller's environment gives an option its value."""
    for name in [n for n in os.environ if n.startswith("MEDTPE_")]:
        monkeypatch.delenv(name)


def commands(
    group: click.Group = cli, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """(the words naming it, the command) of every command under `group`, subgroups walked."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def wrong_kinds(param: click.Parameter) -> list[str]:
    """The kinds of wrong value `param` can be given (`wrong_value`)."""
    kind = param.type
    if isinstance(kind, TaskNames):
        return ["unknown task", "repeated task"]
    if isinstance(kind, TaskName):
        return ["unknown task"]
    if isinstance(kind, click.Choice):
        return ["unknown choice"]
    if isinstance(kind, HoldingPath):
        return ["missing path", "directory holding nothing"]
    if isinstance(kind, click.Path) and kind.exists:
        return ["missing path"]
    if isinstance(kind, Url):
        return ["malformed URL"]
    if isinstance(kind, RayAddress):
        return ["malformed address"]
    if isinstance(kind, click.IntRange | click.FloatRange):
        return ["out of range", "no number"]
    if isinstance(kind, click.types.IntParamType | click.types.FloatParamType):
        return ["no number"]
    if isinstance(kind, click.DateTime):
        return ["no date"]
    return []


def wrong_value(param: click.Parameter, kind: str, tmp_path: Path) -> str:
    """A value of `param` of the wrong `kind`."""
    if kind == "out of range":
        bounds = param.type
        assert isinstance(bounds, click.IntRange | click.FloatRange)
        return str(bounds.min - 1 if bounds.min is not None else bounds.max + 1)
    if kind == "directory holding nothing":
        return str(tmp_path)
    values = {
        "unknown task": "no_such_task",
        "repeated task": "icu_mortality,icu_mortality",
        "unknown choice": "no-such-choice",
        "missing path": str(tmp_path / "no-such-path"),
        "malformed URL": f"ftp://user:{SECRET}@host/x",
        "malformed address": "nowhere",
        "no number": "many",
        "no date": "someday",
    }
    return values[kind]


CASES = [
    pytest.param(words, param.name, kind, id=f"{' '.join(words)} {param.opts[0]} {kind}")
    for words, command in commands()
    for param in command.params
    for kind in wrong_kinds(param)
]


def invoke(args: list[str]) -> Result:
    """`medtpe ARGS` in this process; no heavy library gets imported on the way."""
    before = set(sys.modules)
    result = CliRunner().invoke(cli, args, prog_name="medtpe")
    assert not {m for m in set(sys.modules) - before if m.split(".")[0] in HEAVY}
    return result


def error_line(result: Result) -> str:
    """The `Error:` line of a usage error, once checked that the output is click's usage, its
    hint and that one line, with no traceback (exit status 2)."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.output.splitlines()
    assert len(lines) == 4, result.output
    assert lines[0].startswith("Usage: medtpe ") and lines[1].startswith("Try 'medtpe ")
    assert lines[2] == "" and lines[3].startswith("Error: ")
    return lines[3]


def find(words: tuple[str, ...]) -> click.Command:
    """The command `medtpe WORDS`."""
    return dict(commands())[words]


@pytest.mark.parametrize(("words", "name", "kind"), CASES)
def test_a_wrong_value_is_a_one_line_usage_error_naming_the_option(
    words: tuple[str, ...], name: str, kind: str, tmp_path: Path
) -> None:
    param = next(p for p in find(words).params if p.name == name)
    value = wrong_value(param, kind, tmp_path)
    if isinstance(param, click.Argument):  # the arguments before it get placeholders
        arguments = [p for p in find(words).params if isinstance(p, click.Argument)]
        args = [*(["x"] * arguments.index(param)), value]
        shown = param.make_metavar(click.Context(find(words)))
    else:  # read first: its error comes before any other option's
        args, shown = [param.opts[0], value], param.opts[0]
    line = error_line(invoke([*words, *args]))
    assert shown in line
    assert SECRET not in line
    if kind == "unknown task":
        known = list(param.type.known())  # type: ignore[attr-defined]
        assert known and all(task in line for task in known)
    if kind == "repeated task":
        assert "'icu_mortality' named more than once" in line


@pytest.mark.parametrize("words", [words for words, _ in commands()], ids=" ".join)
def test_an_unknown_option_is_a_one_line_usage_error(words: tuple[str, ...]) -> None:
    assert "--no-such-option" in error_line(invoke([*words, "--no-such-option"]))


def test_every_value_checked_is_met_and_every_other_is_free() -> None:
    """A parameter is met by a wrong value of its kind, or takes free text, a flag or a path to
    write: a new kind of value gets its wrong value here."""
    for words, command in commands():
        for param in command.params:
            free = isinstance(
                param.type, click.types.StringParamType | click.types.BoolParamType
            ) or (isinstance(param.type, click.Path) and not param.type.exists)
            assert bool(wrong_kinds(param)) != free, (words, param.name, param.type)
    kinds = {kind for _, _, kind in (case.values for case in CASES)}
    assert kinds == {
        "unknown task",
        "repeated task",
        "unknown choice",
        "missing path",
        "directory holding nothing",
        "malformed URL",
        "malformed address",
        "out of range",
        "no number",
        "no date",
    }
    tasks = {words for words, _, kind in (case.values for case in CASES) if kind == "unknown task"}
    assert tasks == {(name,) for name in ("build-artefact", "evaluate", "labels", "outcomes")} | {
        ("predict",),
        ("render",),
    }
    lists = {words for words, _, kind in (case.values for case in CASES) if kind == "repeated task"}
    assert lists == {("predict",)}


def test_an_unknown_command_is_a_one_line_usage_error() -> None:
    result = invoke(["no-such-command"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.splitlines()[-1] == "Error: No such command 'no-such-command'."


def test_the_task_variable_is_checked_as_the_option_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDTPE_TASK", "no_such_task")
    line = error_line(invoke(["outcomes", "--meds", "."]))
    assert "'--task'" in line and "MEDTPE_TASK" in line
    assert all(task in line for task in list_tasks())


def test_a_dataset_that_is_not_meds_is_one_line(tmp_path: Path) -> None:
    """An error a layer finds in what the user gave, after the command line is read: one line
    (exit status 1), before any model loads."""
    labels = tmp_path / "labels.parquet"
    labels.write_bytes(b"")
    args = ["--meds", str(tmp_path), "--labels", str(labels), "--task", "icu_mortality"]
    result = invoke(["evaluate", *args, "--out", str(tmp_path / "report.json")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.output.splitlines() == [
        f"Error: {tmp_path}: no 'data/' directory (not a MEDS dataset)"
    ]


def test_the_installed_command_prints_no_traceback(tmp_path: Path) -> None:
    """The console script as a newcomer runs it, with a task that does not exist."""
    argv = medtpe_command("outcomes", task="nosuchtask", meds=tmp_path)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    line = out.stderr.splitlines()[-1]
    assert line.startswith("Error: Invalid value for '--task'") and "unknown task" in line
