"""Which CPU cores the vLLM CPU engine computes on: the one owner of that choice for every caller
(the service, `medtpe evaluate`, `medtpe predict`, the build's pseudo-labelling and gate, and
stock `vllm serve` through the plugin).

vLLM's CPU backend, left alone, pins its worker's OpenMP threads one per core to the process's
allowed cores minus one per worker, which it keeps for its scheduler (`VLLM_CPU_OMP_THREADS_BIND=
auto`). On a 2-core machine that is core 0 alone: prefill, nearly all of a prediction's time, runs
on one thread, and every engine started on the machine (two test workers, a service beside an
evaluation) runs on that same core while core 1 idles. Here, on a machine of at most
`SMALL_MACHINE_CORES` allowed cores, the engine's threads (one per allowed core) are not pinned
(`nobind`): pinned, every engine's main thread (the OpenMP master, which also runs all the
engine's serial work) would sit on the first core, so two engines would still pile up there; the
kernel spreads unpinned threads over the cores. `reserved` cores (setting
`MEDTPE_CPU_RESERVED_CORES`) pins the engine to the others instead, leaving those to the API
processes on a bigger machine. vLLM's own variables, when the operator sets them, win.

Example: `cpu_binding([0, 1], None, 1)` -> `{"VLLM_CPU_OMP_THREADS_BIND": "nobind",
"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}`;
`cpu_binding(range(8), 2, 1)` pins to cores 0-5.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence

SMALL_MACHINE_CORES = 4
"""Up to this many allowed cores, the engine uses them all unless told to reserve some."""
RESERVED_CORES_ENV = "MEDTPE_CPU_RESERVED_CORES"
"""The setting, read by the plugin in `vllm serve` (the service reads it as a setting)."""
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
RESERVED_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
"""vLLM's switch for the engine's processes: "0" runs a one-worker CPU model in the engine core
(in the offline `vllm.LLM`, the engine core in the caller's process)."""
UNPINNED = "nobind"
"""vLLM's binding value for threads left to the kernel's scheduler (as many as allowed cores)."""

_written: dict[str, str] = {}
"""The values this module put into `os.environ` (the rest are the operator's: never replaced)."""


def cpu_binding(allowed: Sequence[int], reserved: int | None, workers: int) -> dict[str, str]:
    """vLLM's CPU-backend variables for an engine of `workers` worker processes (tensor x
    pipeline parallel) on the `allowed` cores, `reserved` of them (the last ones) left out;
    `reserved` None: none on a machine of at most `SMALL_MACHINE_CORES` cores, vLLM's own
    reservation (one core per worker; empty dict) above. One worker on all the cores of a small
    machine: threads not pinned, and the model computed in the engine core (module docstring);
    otherwise each worker is pinned to an equal share of the engine's cores.

    Raises ValueError when fewer than one core per worker would remain."""
    cores = sorted(allowed)
    small = len(cores) <= SMALL_MACHINE_CORES
    if reserved is None and not small:
        return {}
    reserved = reserved or 0
    if small and reserved == 0 and workers == 1:
        return {BIND_ENV: UNPINNED, RESERVED_ENV: "0", MULTIPROCESSING_ENV: "0"}
    engine = cores[: len(cores) - reserved]
    if reserved < 0 or len(engine) < workers:
        raise ValueError(
            f"{RESERVED_CORES_ENV}={reserved} leaves {max(len(engine), 0)} of the "
            f"{len(cores)} allowed cores to an engine of {workers} worker(s): at least one each"
        )
    share = len(engine) // workers
    lists = [engine[i * share : (i + 1) * share] for i in range(workers)]
    return {
        BIND_ENV: "|".join(",".join(map(str, cpus)) for cpus in lists),
        RESERVED_ENV: str(reserved),
    }


def bind_engine_cores(
    reserved: int | None,
    workers: int = 1,
    *,
    replace: bool = True,
    environ: MutableMapping[str, str] = os.environ,
) -> dict[str, str]:
    """Put `cpu_binding` for this process's allowed cores into `environ` (vLLM's engine
    processes, spawned later, read it there), unless the operator set those variables; with
    `replace` False (the plugin, loaded in every vLLM process, the engine's own pinned worker
    included) only when neither is set yet, so an engine wrapper's choice made earlier in the
    process, or its parent's, stands; the operator's `VLLM_ENABLE_V1_MULTIPROCESSING` stands
    too. Returns what it wrote."""
    names = (BIND_ENV, RESERVED_ENV)
    if any(_theirs(n, environ) or (n in environ and not replace) for n in names):
        return {}  # the operator's binding (or, for the plugin, any earlier one): keep it whole
    chosen = cpu_binding(os.sched_getaffinity(0), reserved, workers)
    if _theirs(MULTIPROCESSING_ENV, environ):
        chosen.pop(MULTIPROCESSING_ENV, None)
    for name in (*names, MULTIPROCESSING_ENV):  # an earlier engine's choice, not chosen now
        if name not in chosen and name in environ and not _theirs(name, environ):
            del environ[name]
    environ.update(chosen)
    _written.update(chosen)
    return chosen


def _theirs(name: str, environ: MutableMapping[str, str]) -> bool:
    """Whether `name` holds a value this module did not write (the operator's)."""
    return name in environ and environ[name] != _written.get(name)


def reserved_from_env(environ: MutableMapping[str, str] = os.environ) -> int | None:
    """`MEDTPE_CPU_RESERVED_CORES` as the plugin reads it (None: unset or `none`)."""
    value = environ.get(RESERVED_CORES_ENV, "").strip().lower()
    if value in ("", "none"):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{RESERVED_CORES_ENV}={value!r} is not a whole number") from None
