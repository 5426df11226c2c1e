"""Build the virtual environment that Epic's seismometer runs in: `.cache/seismometer-venv`
(under `MEDTPE_CACHE_DIR` when set), from the pinned `requirements/seismometer.txt`. seismometer
0.5.0 needs pandas<3 and pyarrow<20, which the project's own environment has passed, so it gets
its own. Idempotent: a venv built from the same requirements is kept (their SHA-256 is stamped
inside it); one process builds at a time (a lock file).

    .venv/bin/python -m tools.scripts.seismometer_venv   # prints the venv's python
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from medtpe.core.paths import cache_dir

REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements" / "seismometer.txt"
STAMP = ".requirements-sha256"
INSTALL_TIMEOUT_S = 1800


def venv_dir() -> Path:
    """Where the venv lies."""
    return cache_dir() / "seismometer-venv"


def venv_python() -> Path:
    """The venv's interpreter."""
    return venv_dir() / "bin" / "python"


def build() -> Path:
    """The venv's interpreter, the venv built first unless it is built from these requirements
    already; `subprocess.CalledProcessError` when pip cannot install them."""
    target = venv_dir()
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / "seismometer-venv.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = target / STAMP
        if stamp.is_file() and stamp.read_text().strip() == wanted and venv_python().exists():
            return venv_python()
        shutil.rmtree(target, ignore_errors=True)
        venv.create(target, with_pip=True)
        subprocess.run(
            [str(venv_python()), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)],
            check=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        stamp.write_text(wanted + "\n")
    return venv_python()


if __name__ == "__main__":
    try:
        print(build())
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"seismometer's venv could not be built: {exc}")
