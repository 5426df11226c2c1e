"""A task's operating threshold on p("yes"): a prediction is flagged when p ≥ threshold. 0.5
unless a thresholds file says otherwise, per task and per site (the file `medtpe monitor
--thresholds` reads and the service's `MEDTPE_THRESHOLDS_FILE`, so the report counts as flags
what the cards showed as warnings):

    default: 0.5
    tasks:
      icu_mortality:
        default: 0.3
        sites: {tenant-a: 0.25}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

DEFAULT_THRESHOLD = 0.5
MAX_FILE_BYTES = 1 << 20


class ThresholdsError(ValueError):
    """A thresholds file that is not as documented."""


def _probability(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ThresholdsError(f"{where}: expected a number between 0 and 1, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Thresholds:
    """The operating thresholds: a default, each task's, each task's per site."""

    default: float = DEFAULT_THRESHOLD
    tasks: dict[str, float] = field(default_factory=dict)
    sites: dict[tuple[str, str], float] = field(default_factory=dict)

    def of(self, task: str, site: str | None = None) -> float:
        """The threshold of `task` at `site` (None: no site)."""
        if site is not None and (task, site) in self.sites:
            return self.sites[task, site]
        return self.tasks.get(task, self.default)

    @classmethod
    def parse(cls, data: object, where: str = "thresholds") -> Thresholds:
        """The thresholds of a file's data (`ThresholdsError` naming the faulty entry)."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping) or set(data) - {"default", "tasks"}:
            raise ThresholdsError(f"{where}: expected the keys `default` and `tasks`")
        default = _probability(data.get("default", DEFAULT_THRESHOLD), f"{where}: default")
        tasks: dict[str, float] = {}
        sites: dict[tuple[str, str], float] = {}
        for task, entry in (data.get("tasks") or {}).items():
            at = f"{where}: tasks.{task}"
            if not isinstance(entry, Mapping) or set(entry) - {"default", "sites"}:
                raise ThresholdsError(f"{at}: expected the keys `default` and `sites`")
            if "default" in entry:
                tasks[str(task)] = _probability(entry["default"], f"{at}.default")
            for site, value in (entry.get("sites") or {}).items():
                sites[str(task), str(site)] = _probability(value, f"{at}.sites.{site}")
        return cls(default, tasks, sites)

    @classmethod
    def load(cls, path: Path | None) -> Thresholds:
        """The thresholds of the YAML file `path` (None: 0.5 everywhere; at most 1 MiB)."""
        if path is None:
            return cls()
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ThresholdsError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
        try:
            return cls.parse(yaml.safe_load(path.read_text(encoding="utf-8")), str(path))
        except yaml.YAMLError as exc:
            raise ThresholdsError(f"{path}: not YAML: {exc}") from exc
