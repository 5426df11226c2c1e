"""The monitoring commands run in-process (click's runner)."""

from __future__ import annotations

import click
from click.testing import CliRunner


def invoke(command: click.Command, *args: str) -> tuple[int, str]:
    """(exit code, output) of `command` with `args`."""
    result = CliRunner().invoke(command, list(args), catch_exceptions=False)
    return result.exit_code, result.output
