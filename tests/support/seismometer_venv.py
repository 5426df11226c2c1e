"""seismometer's own venv for the tests (built once, then reused, by
`tools.scripts.seismometer_venv` in a child process, as `make seismometer-venv` runs it), and a
monitoring export loaded by seismometer's own code (`tests/support/seismometer_load.py`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

LOAD_TIMEOUT_S = 300
UNBUILT = "seismometer's venv could not be built"
"""How the builder's message begins when pip cannot install the requirements (or runs out of
time)."""


def seismometer_python() -> Path:
    """The venv's interpreter; the test is skipped, with the builder's reason, only when the
    pinned requirements cannot be installed here (no package index reachable)."""
    done = subprocess.run(
        [sys.executable, "-m", "tools.scripts.seismometer_venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 and done.stderr.startswith(UNBUILT):
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


def seismometer_load(python: Path, folder: Path) -> dict:
    """What seismometer loads from the export in `folder`."""
    done = subprocess.run(
        [str(python), str(ROOT / "tests" / "support" / "seismometer_load.py"), str(folder)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=LOAD_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
