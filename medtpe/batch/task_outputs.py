"""A batch run's files, task by task: where each task's files go (`task_dir`: `<out>/` for one
task, `<out>/<task>/` for several), a shard's records file and predictions file written under a
temporary name and renamed (`write_shard`, the predictions file last: the shard's completion mark;
`shard_done`), each task's results of a shard (`Answered`) written in turn (`write_tasks`), and
the summary of every records file under a run's directory (`summarise`, `summary.json`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medtpe.batch.rows import RecordRow, predictions_table, read_records, records_table
from medtpe.core.metrics import compression_rate
from medtpe.core.tasks import Task

RECORDS_SUFFIX = ".records.pq"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class Answered:
    """One task's result for a record: its records-file row and its prompt's tokens the engine
    was given and read from its prefix cache (0 and 0: the prompt never reached the engine)."""

    row: RecordRow
    prompt_tokens: int = 0
    cached_tokens: int = 0


def predictions_path(out_dir: Path, name: str) -> Path:
    """Where a shard's predictions go."""
    return Path(out_dir) / f"{name}.parquet"


def records_path(out_dir: Path, name: str) -> Path:
    """Where a shard's per-record results go."""
    return Path(out_dir) / f"{name}{RECORDS_SUFFIX}"


def task_dir(out_dir: Path, tasks: Sequence[Task], task: Task) -> Path:
    """Where `task`'s files go in a run asking `tasks`: `out_dir` for one task, else
    `<out_dir>/<task>`."""
    return Path(out_dir) if len(tasks) == 1 else Path(out_dir) / task.name


def shard_done(out_dir: Path, name: str, tasks: Sequence[Task]) -> bool:
    """Whether a shard's outputs are complete for every one of `tasks` (each task's predictions
    file is written after its records file)."""
    return all(
        predictions_path(d, name).is_file() and records_path(d, name).is_file()
        for d in (task_dir(out_dir, tasks, task) for task in tasks)
    )


def write_atomically(table: pa.Table, path: Path) -> None:
    """Write a parquet file under a temporary name beside `path`, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def write_shard(
    out_dir: Path, name: str, task: Task, rows: Sequence[RecordRow], labelled: bool
) -> None:
    """A shard's records file, then its predictions file (the completion mark)."""
    write_atomically(records_table(rows), records_path(out_dir, name))
    write_atomically(predictions_table(task, rows, labelled), predictions_path(out_dir, name))


def write_tasks(
    out_dir: Path,
    name: str,
    tasks: Sequence[Task],
    answered: Sequence[Sequence[Answered]],
    labelled: bool,
) -> None:
    """A shard's files for each of `tasks` (`answered`: each record's results, in task order),
    task after task (`write_shard` in `task_dir`)."""
    for index, task in enumerate(tasks):
        rows = [record[index].row for record in answered]
        write_shard(task_dir(out_dir, tasks, task), name, task, rows, labelled)


def failure_kind(error: str) -> str:
    """A failure reason without its message (stage and exception type)."""
    return ": ".join(error.split(": ")[:2])


def summarise(
    out_dir: Path, run: dict[str, Any], tasks: Sequence[Task] | None = None
) -> dict[str, Any]:
    """The summary of every records file under `out_dir` (this run's and earlier runs'; with
    several `tasks`, every task's, and each task's own under `tasks`), with this run's figures
    `run`; written to `<out_dir>/summary.json`."""
    summary = records_figures(out_dir)
    if tasks is not None and len(tasks) > 1:
        summary["tasks"] = {t.name: records_figures(task_dir(out_dir, tasks, t)) for t in tasks}
    summary["this_run"] = run
    path = Path(out_dir) / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # jobs of a partition may race
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return summary


def records_figures(out_dir: Path) -> dict[str, Any]:
    """Records, shards, failures (by kind) and token counts of every records file under
    `out_dir`."""
    n_records = failures = original_tokens = medtpe_tokens = 0
    kinds: Counter[str] = Counter()
    files = sorted(Path(out_dir).glob(f"**/*{RECORDS_SUFFIX}"))
    for path in files:
        table = read_records(path, ["error", "original_tokens", "medtpe_tokens"])
        errors = [e for e in table.column("error").to_pylist() if e is not None]
        n_records += table.num_rows
        failures += len(errors)
        kinds.update(failure_kind(e) for e in errors)
        original_tokens += pc.sum(table.column("original_tokens")).as_py() or 0
        medtpe_tokens += pc.sum(table.column("medtpe_tokens")).as_py() or 0
    return {
        "records": n_records,
        "shards": len(files),
        "failures": failures,
        "failure_kinds": dict(kinds.most_common()),
        "original_tokens": original_tokens,
        "medtpe_tokens": medtpe_tokens,
        "compression_rate": compression_rate(original_tokens, medtpe_tokens)
        if original_tokens
        else None,
    }
