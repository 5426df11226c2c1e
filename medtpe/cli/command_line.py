"""The argument list of a `medtpe` command run in a child process (tests, benchmarks)."""

from __future__ import annotations

import sys
from pathlib import Path


def medtpe_command(command: str, *args: str, **options: str | Path | float | bool) -> list[str]:
    """`medtpe COMMAND ARGS... --OPTION VALUE...` with the `medtpe` of this interpreter's
    environment; an option's name has dashes for underscores, True gives the bare flag."""
    argv = [str(Path(sys.executable).with_name("medtpe")), command, *args]
    for name, value in options.items():
        argv.append(f"--{name.replace('_', '-')}")
        if value is not True:
            argv.append(str(value))
    return argv
