"""The map step of sharded mining on Ray Data: one row per data shard, counted by the same
`count_shard` as the worker processes in Ray tasks of one CPU each, results streamed back in
shard order so the driver merges them one at a time (`sharded_mining.count_meds_corpus`).

The shard paths and the base tokenizer file must be readable at the same paths on every node
(a shared volume, as in deploy/k8s/rayjob-mine.yaml)."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from medtpe.core.ray_cluster import ray_session

# One tokenizer thread per Ray task: the tasks are the parallelism (as in the worker processes).
_TASK_ENV = {"env_vars": {"RAYON_NUM_THREADS": "1"}}

T = TypeVar("T")
"""What the mapped function returns (picklable)."""


def _count_row(row: dict[str, Any], fn: Callable[[Path], T]) -> dict[str, Any]:
    return {"index": row["index"], "counts": pickle.dumps(fn(Path(row["shard"])), protocol=5)}


def ray_ordered_map(fn: Callable[[Path], T], shards: Sequence[Path], address: str) -> Iterator[T]:
    """`fn` over `shards` on the Ray cluster at `address` ("local": a new local cluster), the
    results in shard order."""
    import ray.data

    with ray_session(address):
        rows = [{"index": i, "shard": str(shard)} for i, shard in enumerate(shards)]
        ds = ray.data.from_items(rows, override_num_blocks=len(rows))
        ds.context.execution_options.preserve_order = True
        ds.context.enable_progress_bars = False  # the caller shows progress per merged shard
        ds = ds.map(_count_row, fn_kwargs={"fn": fn}, num_cpus=1, runtime_env=_TASK_ENV)
        for expected, row in enumerate(ds.iter_rows()):
            if row["index"] != expected:
                raise RuntimeError(f"Ray Data returned shard {row['index']} before {expected}")
            yield pickle.loads(row["counts"])
