"""A measurement's results file: the figures plus where and when they were measured (cores,
load average, commit), so the docs cite a file, not a terminal."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """Cores, load averages, platform, Python, UTC time and the repository's commit."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit or None,
    }


def write_results(path: Path | None, command: str, results: Any) -> None:
    """Write `{"command", "machine", "results"}` as JSON to `path` (nothing when None), whole or
    not at all (a scratch file beside it, then renamed)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"command": command, "machine": machine(), "results": results}
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(json.dumps(body, indent=1) + "\n")
    os.replace(scratch, path)
    print(f"results: {path}")
