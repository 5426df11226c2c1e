"""A build's finished steps and their results (`<work>/state.json`): what lets `medtpe
build-artefact` resume after an interruption and refuse a work directory of other settings."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"


class BuildStateError(ValueError):
    """The work directory holds a build with other settings."""


class BuildState:
    """The finished steps of a build and their results (`<work>/state.json`)."""

    def __init__(self, path: Path, identity: dict[str, Any]):
        self.path = path
        self.steps: dict[str, Any] = {}
        if path.is_file():
            saved = json.loads(path.read_text())
            if saved["identity"] != identity:
                changed = sorted(
                    k
                    for k in saved["identity"].keys() | identity.keys()
                    if saved["identity"].get(k) != identity.get(k)
                )
                raise BuildStateError(
                    f"{path.parent} holds a build with other settings ({', '.join(changed)}): "
                    "restart it (--restart) or choose another output directory"
                )
            self.steps = saved["steps"]
        self.identity = identity

    def done(self, name: str) -> bool:
        """Whether step `name` has finished."""
        return name in self.steps

    def finish(self, name: str, result: Any, seconds: float) -> None:
        """Record step `name`'s result (written atomically)."""
        self.steps[name] = {"result": result, "seconds": round(seconds, 1)}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"identity": self.identity, "steps": self.steps}, indent=1))
        os.replace(tmp, self.path)

    def result(self, name: str) -> Any:
        """Step `name`'s recorded result."""
        return self.steps[name]["result"]
