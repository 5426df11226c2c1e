"""How `make test` shares its groups between the pytest-xdist workers (`--dist loadgroup`).

tests/conftest.py gives every test a group (its file, or a shared one) named with its kind:
`engine:NAME` when any of its tests carries the `engine` marker (it starts a real vLLM engine:
tens of seconds to minutes), `light:NAME` otherwise, and orders the collection engine groups
first, the longest allowed (`timeout` marker) first. pytest-xdist's own loadgroup scheduler hands
each worker two groups at the start and a further one whenever it has two tests or fewer left:
a long engine group could then sit queued behind another on a busy worker while the other
worker ran out of work. This scheduler instead:

- starts each worker on one group, and gives it the next only when it reaches its last test
  (a worker runs a test only once it knows the next one, so it gets it then);
- behind a last test of an engine group it queues the last light group of the queue (seconds of
  work) rather than the next engine group, so no engine group waits behind another: it goes to
  whichever worker comes free first.

Nothing is tuned per test: a new test file that starts an engine and carries the marker falls
into this order.
"""

from __future__ import annotations

from xdist.scheduler import LoadGroupScheduling
from xdist.workermanage import WorkerController

ENGINE_KIND = "engine"
LIGHT_KIND = "light"


def group_name(kind: str, name: str) -> str:
    """The pytest-xdist group of a test: its kind and its name (a file, or a shared group)."""
    return f"{kind}:{name}"


def is_engine_group(scope: str) -> bool:
    """Whether a group (a scheduling scope) holds real-engine tests."""
    return scope.startswith(f"{ENGINE_KIND}:")


class EngineFirstScheduling(LoadGroupScheduling):
    """`--dist loadgroup` with the engine groups spread as above (module docstring)."""

    def schedule(self) -> None:
        """One group per worker to start with, in collection order."""
        assert self.collection_is_completed
        if self.collection is not None:  # a worker was added later: give it work
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        for nodeid in self.collection:
            self.workqueue.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        for node in list(self.nodes)[len(self.workqueue) :]:  # more workers than groups
            self.assigned_work.pop(node, None)
            node.shutdown()
        for node in self.nodes:
            if self.workqueue and not node.shutting_down:
                self._assign(node, next(iter(self.workqueue)))
        for node in self.nodes:
            self._reschedule(node)

    def _reschedule(self, node: WorkerController) -> None:
        """Give `node` its next group once it is on its last test (see the module docstring)."""
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        work = self.assigned_work.get(node, {})
        if self._pending_of(work) > 1:
            return
        scopes = list(self.workqueue)
        running = [scope for scope, tests in work.items() if not all(tests.values())]
        follower = scopes[-1] if running and is_engine_group(running[0]) else scopes[0]
        if is_engine_group(follower):
            follower = scopes[0]
        self._assign(node, follower)

    def _assign(self, node: WorkerController, scope: str) -> None:
        """Send group `scope`'s tests to `node`."""
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some(
            [collection.index(nodeid) for nodeid, done in work_unit.items() if not done]
        )
