"""`make test`'s scheduler (`tests.support.xdist_schedule`), driven as pytest-xdist drives it,
with stand-ins for the two worker processes: each starts on one group, gets its next only on its
last test, and behind an engine group's last test it queues a light group, so an engine group
never waits behind another on a busy worker while the other runs out of work."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support.xdist_schedule import EngineFirstScheduling, group_name


class Worker:
    """What the scheduler sees of a pytest-xdist worker: the test indexes it was sent."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent += indexes

    def shutdown(self) -> None:
        self.shutting_down = True


GROUPS = {  # in the conftest's order: engine groups first
    group_name("engine", "service"): 3,
    group_name("engine", "tests/training/test_build_artefact_qwen2.py"): 1,
    group_name("engine", "tests/inference/engines/test_vllm_engine.py"): 1,
    group_name("light", "tests/core/prompt/test_render.py"): 4,
    group_name("light", "tests/core/metrics/test_metrics.py"): 2,
    group_name("light", "tests/core/meds/test_labels.py"): 2,
}
IDS = [
    f"tests/x.py::test_{group.replace(':', '_')}_{i}@{group}"
    for group in GROUPS
    for i in range(GROUPS[group])
]


def scheduler_with(
    config: pytest.Config, monkeypatch: pytest.MonkeyPatch, workers: list[Worker]
) -> EngineFirstScheduling:
    """The scheduler of a `-n len(workers)` run, once `workers` have started and collected
    `IDS`."""
    monkeypatch.setattr(config.option, "tx", [f"{len(workers)}*popen"], raising=False)
    scheduler = EngineFirstScheduling(config)
    for worker in workers:
        scheduler.add_node(worker)  # type: ignore[arg-type]
        scheduler.add_node_collection(worker, IDS)  # type: ignore[arg-type]
    return scheduler


def groups_sent(worker: Worker) -> list[str]:
    """The groups of the tests sent to `worker`, in order, each once."""
    return list(dict.fromkeys(IDS[i].rsplit("@", 1)[1] for i in worker.sent))


def finish_all_but_last(scheduler: EngineFirstScheduling, worker: Worker) -> None:
    """`worker` completes every test it holds except its last (which waits for a next one)."""
    for index in worker.sent[:-1]:
        if not scheduler.assigned_work[worker][IDS[index].rsplit("@", 1)[1]][IDS[index]]:
            scheduler.mark_test_complete(worker, index)  # type: ignore[arg-type]


def test_engine_groups_go_to_free_workers_and_light_ones_follow(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = Worker("gw0"), Worker("gw1")
    scheduler = scheduler_with(pytestconfig, monkeypatch, [first, second])
    scheduler.schedule()
    engine = [g for g in GROUPS if g.startswith("engine:")]
    light = [g for g in GROUPS if g.startswith("light:")]
    # gw0: the service group (3 tests: no follower yet); gw1: the Qwen2 test, a light follower
    assert groups_sent(first) == [engine[0]]
    assert groups_sent(second) == [engine[1], light[-1]]

    finish_all_but_last(scheduler, first)  # gw0 reaches its last service test: a light follower
    assert groups_sent(first) == [engine[0], light[-2]]
    finish_all_but_last(scheduler, second)  # gw1 on its light follower: the next engine group
    assert groups_sent(second) == [engine[1], light[-1], engine[2]]
    while scheduler.workqueue:
        for worker in (first, second):
            finish_all_but_last(scheduler, worker)
    assert sorted(first.sent + second.sent) == list(range(len(IDS)))
