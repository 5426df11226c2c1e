"""docs/cli.md is the `medtpe` command as it is: its reference part is what `tools.scripts.cli_doc`
writes from the click group today, and its hand-written overview names every command, no
command that is gone, and only options the command has."""

from __future__ import annotations

import re

import click
import pytest

from medtpe.cli.main import cli
from tools.scripts.cli_doc import PAGE, markdown_text, reference, with_reference

PAGE_TEXT = PAGE.read_text()
OVERVIEW = PAGE_TEXT.split("## Reference", 1)[0]


def overview_rows() -> list[tuple[str, str]]:
    """(command name, the row's first cell) for each `medtpe ...` row of the overview table."""
    cells = [
        re.split(r"(?<!\\)\|", line)[1].strip()
        for line in OVERVIEW.splitlines()
        if line.startswith("|")
    ]
    return [(m.group(1), cell) for cell in cells if (m := re.match(r"`medtpe ([\w-]+)", cell))]


def test_the_reference_is_what_the_command_declares() -> None:
    assert with_reference(PAGE_TEXT, reference()) == PAGE_TEXT, (
        "docs/cli.md's reference is not the command's: "
        "run .venv/bin/python -m tools.scripts.cli_doc"
    )


def test_the_overview_names_every_command_and_no_other() -> None:
    named = {name for name, _ in overview_rows()}
    commands = {name for name, c in cli.commands.items() if not c.hidden}
    assert commands - named == set(), "commands missing from docs/cli.md's overview"
    assert named - commands == set(), "docs/cli.md's overview names commands that do not exist"


@pytest.mark.parametrize(("name", "synopsis"), overview_rows(), ids=lambda v: v[:40])
def test_the_overview_writes_only_real_options(name: str, synopsis: str) -> None:
    command = cli.commands[name]
    sub = re.match(rf"`medtpe {re.escape(name)} ([\w-]+)", synopsis)
    if isinstance(command, click.Group) and sub and sub.group(1) in command.commands:
        command = command.commands[sub.group(1)]  # a subcommand's row: `medtpe ledger audit`
    options = {
        opt
        for param in command.params
        if isinstance(param, click.Option)
        for opt in (*param.opts, *param.secondary_opts)
    }
    written = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", synopsis))
    assert written <= options, f"`medtpe {name}` has no {sorted(written - options)}"


def test_every_command_and_option_is_in_the_reference() -> None:
    generated = reference()
    for name, command in cli.commands.items():
        assert f"### `medtpe {name}`" in generated
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert f"| `{param.opts[0]}" in generated, f"{name} {param.opts[0]}"


def test_markdown_text_escapes_outside_code_only() -> None:
    assert (
        markdown_text("a *.ndjson <out> `x_y|z` _since") == r"a \*.ndjson \<out> `x_y\|z` \_since"
    )
    assert markdown_text("icu_mortality\n   on  one line") == "icu_mortality on one line"


def test_a_page_without_the_reference_gets_it_appended() -> None:
    assert with_reference("# Title\n", "GENERATED").endswith("# Title\n\nGENERATED\n")
