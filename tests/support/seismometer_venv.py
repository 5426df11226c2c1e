"""seismometer's own venv for the tests (`tools.scripts.seismometer_venv`: built once, then reused),
and a monitoring export loaded by seismometer's own code (`tests/support/seismometer_load.py`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tools.scripts.seismometer_venv import build

LOAD_TIMEOUT_S = 300


def seismometer_python() -> Path:
    """The venv's interpreter; the test is skipped, with pip's reason, only when the pinned
    requirements cannot be installed here (no package index reachable)."""
    try:
        return build()
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"seismometer's venv cannot be installed here (pip exited {exc.returncode})")
    except subprocess.TimeoutExpired:
        pytest.skip("seismometer's venv could not be installed within the time allowed")


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
