"""The CPU engine's cores (`medtpe.inference.cpu_cores`): every allowed core on a small machine, a
reservation on request, vLLM's own choice on a big machine, the operator's variables never
replaced. (The real engine's threads on every core: tests/inference/engines/test_vllm_engine.py.)"""

from __future__ import annotations

import os

import pytest

from medtpe.inference.cpu_cores import (
    BIND_ENV,
    MULTIPROCESSING_ENV,
    RESERVED_ENV,
    UNPINNED,
    bind_engine_cores,
    cpu_binding,
    reserved_from_env,
)
from medtpe.service.settings import ServiceSettings


def test_small_machine_engine_gets_every_core_unpinned_in_its_core_process() -> None:
    unpinned = {BIND_ENV: UNPINNED, RESERVED_ENV: "0", MULTIPROCESSING_ENV: "0"}
    assert cpu_binding([1, 0], None, 1) == cpu_binding([1, 0], 0, 1) == unpinned
    assert cpu_binding([3], None, 1) == unpinned
    assert cpu_binding([0, 1, 2, 3], 1, 1) == {BIND_ENV: "0,1,2", RESERVED_ENV: "1"}


def test_big_machine_keeps_vllms_reservation_unless_told() -> None:
    assert cpu_binding(range(16), None, 1) == {}
    assert cpu_binding(range(16), 2, 1) == {
        BIND_ENV: ",".join(map(str, range(14))),
        RESERVED_ENV: "2",
    }


def test_workers_share_the_engine_cores() -> None:
    assert cpu_binding(range(8), 0, 2) == {BIND_ENV: "0,1,2,3|4,5,6,7", RESERVED_ENV: "0"}


@pytest.mark.parametrize(("cores", "reserved", "workers"), [(2, 2, 1), (4, 3, 2), (2, -1, 1)])
def test_a_reservation_must_leave_a_core_per_worker(
    cores: int, reserved: int, workers: int
) -> None:
    with pytest.raises(ValueError, match="MEDTPE_CPU_RESERVED_CORES"):
        cpu_binding(range(cores), reserved, workers)


def test_operator_variables_stand_and_own_values_are_replaced() -> None:
    environ: dict[str, str] = {BIND_ENV: "auto"}
    assert bind_engine_cores(0, environ=environ) == {}
    assert environ == {BIND_ENV: "auto"}

    environ = {}
    allowed = sorted(os.sched_getaffinity(0))
    written = bind_engine_cores(0, environ=environ)
    assert environ == written and environ[RESERVED_ENV] == "0"
    # the plugin, loaded later in the same process, leaves the engine wrapper's choice alone
    assert bind_engine_cores(None, replace=False, environ=environ) == {}
    assert environ == written
    if len(allowed) > 1:  # a later engine with another reservation replaces this module's values
        bind_engine_cores(1, environ=environ)
        assert environ[RESERVED_ENV] == "1" and MULTIPROCESSING_ENV not in environ


def test_the_operators_multiprocessing_switch_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1})
    environ = {MULTIPROCESSING_ENV: "1"}  # a worker process of its own, asked for
    written = bind_engine_cores(None, environ=environ)
    assert written == {BIND_ENV: UNPINNED, RESERVED_ENV: "0"}
    assert environ == {**written, MULTIPROCESSING_ENV: "1"}
    bind_engine_cores(1, environ=environ)  # not removed by a later engine's choice either
    assert environ[MULTIPROCESSING_ENV] == "1"


def test_the_setting_is_read_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDTPE_CPU_RESERVED_CORES", "1")
    assert ServiceSettings().model().engine.cpu_reserved_cores == 1
    assert reserved_from_env() == 1
    monkeypatch.setenv("MEDTPE_CPU_RESERVED_CORES", "none")
    assert ServiceSettings().cpu_reserved_cores is None and reserved_from_env() is None
    monkeypatch.setenv("MEDTPE_CPU_RESERVED_CORES", "-1")
    with pytest.raises(ValueError, match="cpu_reserved_cores"):
        ServiceSettings()
    monkeypatch.setenv("MEDTPE_CPU_RESERVED_CORES", "two")
    with pytest.raises(ValueError, match="not a whole number"):
        reserved_from_env()


def test_the_plugin_in_the_engine_s_own_pinned_worker_keeps_the_binding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the worker is pinned to one core and inherits its parent's binding: nothing to compute
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0})
    inherited = {BIND_ENV: "0", RESERVED_ENV: "1", "MEDTPE_CPU_RESERVED_CORES": "1"}
    environ = dict(inherited)
    assert bind_engine_cores(reserved_from_env(environ), replace=False, environ=environ) == {}
    assert environ == inherited
