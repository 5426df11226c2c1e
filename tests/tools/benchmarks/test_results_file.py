"""The results file a measurement writes: its command, the machine and commit it ran on, and
its figures."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tools.benchmarks.results_file import write_results


def test_results_file_holds_command_machine_and_figures(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "bench.json"
    write_results(path, "python -m benchmarks.bench_x --n 3", {"p50_ms": 1.5})
    body = json.loads(path.read_text())
    assert body["command"] == "python -m benchmarks.bench_x --n 3"
    assert body["results"] == {"p50_ms": 1.5}
    machine = body["machine"]
    assert machine["cpus"] == os.cpu_count()
    assert len(machine["load_avg"]) == 3
    assert machine["utc"].endswith("+00:00")
    assert machine["commit"] is None or all(c in "0123456789abcdef" for c in machine["commit"])


def test_no_path_writes_nothing(tmp_path: Path) -> None:
    write_results(None, "cmd", {"x": 1})
    assert list(tmp_path.iterdir()) == []


def test_a_rewrite_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    write_results(path, "cmd", {"cells": [1]})
    write_results(path, "cmd", {"cells": [1, 2]})
    assert json.loads(path.read_text())["results"] == {"cells": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # no scratch file left
