"""Shared fixtures. The service fixtures start real `medtpe serve` processes (vLLM engine on the
default model), once per session: engine start-up dominates their cost."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock
from hypothesis import HealthCheck, settings
from starlette.testclient import TestClient

from medtpe.core.meds import MedsDataset
from medtpe.core.prompt import ChatTemplate, render_record
from medtpe.core.tokenizer import BaseTokenizer
from tests.support.cds_support import FHIR_TOKEN, ICU_BUNDLE
from tests.support.ehr import Ehr, serving_ehr
from tests.support.fhir_server import running_fhir_server
from tests.support.meds_fixtures import train_tokenizer
from tests.support.paths import FIXTURES
from tests.support.server_fixtures import (  # noqa: F401 (fixtures of every test)
    ledger_url,
    postgres_server,
    redis_server,
)
from tests.support.service_support import (
    SERVICE_API_KEY,
    SHUTDOWN_GRACE_S,
    Api,
    ServedApi,
    ServiceProcess,
    instant_client,
    instant_settings,
    running_service,
    service_artefact,
    service_env,
)
from tests.support.xdist_schedule import (
    ENGINE_KIND,
    LIGHT_KIND,
    EngineFirstScheduling,
    group_name,
)

SERVICE_GROUP = "service"
"""pytest-xdist group of the tests on the session's service (`service_server`)."""

# CI (`CI=true`, as .ci/run is called) draws the same examples on every run, so a red build is
# reproducible and never flaky; locally each run explores new ones. HYPOTHESIS_PROFILE overrides.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_configure(config: pytest.Config) -> None:
    """In a run of several pytest-xdist workers, each worker (and every engine, service and
    process it starts) keeps to its own equal share of the allowed cores: the engine wrapper
    gives an engine all the cores its process may use (`medtpe.inference.cpu_cores`), and two
    engines' OpenMP threads on the same two cores wait on each other's time slices at every
    barrier."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0))
    if worker.startswith("gw") and 1 < count <= len(cores):
        share = len(cores) // count
        index = int(worker[2:]) % count
        os.sched_setaffinity(0, cores[index * share : (index + 1) * share])


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The test that stops the session's service runs after every other test (whatever the
    order of the directories), so every real-engine test before it shares that one service; the
    real-engine tests first (`_run_order`). Each test gets its pytest-xdist group (`make test`
    runs two workers, `--dist loadgroup`): its file's, or one for all the files with a test on
    the session's service (one service start; the test that stops it runs last there), or the
    one its file names (the Ray tests share one: one local cluster at a time); the group's name
    says its kind, `engine:` when one of its tests carries the `engine` marker, else `light:`,
    which is how `tests.support.xdist_schedule` spreads the engine groups over the workers."""
    on_service = {_file(item) for item in items if _uses_service(item)}
    items.sort(key=lambda item: _run_order(item, on_service))
    names = {item: _group(item, on_service) for item in items}
    engine = {names[item] for item in items if item.get_closest_marker("engine")}
    for item, name in names.items():
        kind = ENGINE_KIND if name in engine else LIGHT_KIND
        item.add_marker(pytest.mark.xdist_group(group_name(kind, name)), append=False)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup`: the engine groups spread over the workers (`EngineFirstScheduling`)."""
    if config.getoption("dist") == "loadgroup":
        return EngineFirstScheduling(config, log)
    return None


def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """Under `--dist loadgroup`, stop when pytest-xdist did not tag the tests with their group
    (pytest 9.2 with pytest-xdist 3.8): each test would go its own way, and module fixtures
    (services, engines) would start once per worker and test."""
    if node.config.option.dist == "loadgroup" and not all("@" in i for i in ids):
        pytest.exit("pytest-xdist did not group the tests: see pyproject's pytest pin", 4)


def _run_order(item: pytest.Item, on_service: set[str]) -> tuple[bool, bool, bool, float]:
    """Sort key: the test that stops the session's service last; before every other test, the
    real-engine ones (minutes each), those on the session's service first (the longest group:
    its one service serves every test of its files), then those allowed the longest (`timeout`
    marker): the groups are handed out in this order, so the long ones start first and the
    short ones fill in beside them."""
    slow = any(item.get_closest_marker(name) for name in ("slow", "engine"))
    timeout = item.get_closest_marker("timeout")
    allowed = float(timeout.args[0]) if timeout and timeout.args else 0.0
    last = item.get_closest_marker("stops_service") is not None
    return last, not slow, _file(item) not in on_service, -allowed


def _uses_service(item: pytest.Item) -> bool:
    """Whether the test runs on the session's service: it names `service_server`, or it is the
    served half of the `api` fixture (which asks for `service_server` only when it runs, so
    the fixture closure does not show it: those files each started a service of their own on
    whichever worker ran them, and could run after the test that stops the service)."""
    if "service_server" in getattr(item, "fixturenames", ()):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("api") == "vllm"


def _group(item: pytest.Item, on_service: set[str]) -> str:
    """The test's group name without its kind: the one its file names, else the session
    service's, else its file's."""
    named = item.get_closest_marker("xdist_group")
    if named is not None:
        return str(named.args[0] if named.args else named.kwargs.get("name", "default"))
    return SERVICE_GROUP if _file(item) in on_service else _file(item)


def _file(item: pytest.Item) -> str:
    """The test's file: the unit of a pytest-xdist group (its module fixtures start once)."""
    return item.nodeid.split("::", 1)[0]


@pytest.fixture(scope="session")
def service_files() -> tuple[Path, Path]:
    """(artefact dir, export dir) the service tests run on, prepared once (under a file lock:
    test runs side by side may prepare the same cache at the same time)."""
    from medtpe.core.paths import cache_dir

    cache = cache_dir() / "test-fixtures"
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(cache / "service-files.lock"):
        return service_artefact(cache)


@pytest.fixture(scope="session")
def ehr() -> Iterator[Ehr]:
    """An EHR calling the CDS hooks: its ES384 key, its JWK Set served over HTTP."""
    with serving_ehr() as ehr:
        yield ehr


@pytest.fixture(scope="session")
def fhir_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The test FHIR server (tests/support/fhir_server.py) holding the CDS Hooks test patient;
    `slow-` patients answer after 6 s (past the hooks' FHIR deadline in the tests, 2 s)."""
    data = tmp_path_factory.mktemp("fhir-data")
    (data / "icu.json").write_text(ICU_BUNDLE.read_text())
    with running_fhir_server(data, FHIR_TOKEN, data / "server.log", delay_s=6) as url:
        yield url


@pytest.fixture(scope="session")
def service_server(
    service_files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory, ehr: Ehr
) -> Iterator[ServiceProcess]:
    """The service with API keys, a 256 KiB body limit, a short grace period and `ehr` allowed
    to call the CDS hooks (fetching from an http FHIR server) (stopped by the shutdown test)."""
    env = service_env(
        service_files,
        MEDTPE_API_KEYS=f"{SERVICE_API_KEY},test-key-2",
        MEDTPE_MAX_REQUEST_BYTES=str(256 * 1024),
        MEDTPE_SHUTDOWN_GRACE_S=str(SHUTDOWN_GRACE_S),
        MEDTPE_CDS_ISSUERS=ehr.issuers_setting("*"),
        MEDTPE_CDS_ALLOW_HTTP_FHIR="true",
    )
    with running_service(env, tmp_path_factory.mktemp("service") / "service.log") as server:
        yield server


@pytest.fixture(scope="session")
def instant_api(service_files: tuple[Path, Path]) -> Iterator[TestClient]:
    """The app in-process with `service_server`'s settings, on an engine that answers at once."""
    with instant_client(instant_settings(service_files)) as client:
        yield client


@pytest.fixture(
    params=["instant", pytest.param("vllm", marks=[pytest.mark.slow, pytest.mark.engine])]
)
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    """The HTTP API twice: in-process on an instant engine, and served on the real vLLM engine."""
    if request.param == "instant":
        yield request.getfixturevalue("instant_api")
        return
    with ServedApi(request.getfixturevalue("service_server")) as client:
        yield client


@pytest.fixture(scope="module")
def tokenizer(dataset: MedsDataset) -> BaseTokenizer:
    """A small BPE trained on the module's `dataset` fixture, rendered (a stand-in base)."""
    return train_tokenizer([render_record(s, dataset.descriptions).text for s in dataset])


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    """SmolLM2's chat template (committed fixture)."""
    return ChatTemplate.from_model_dir(FIXTURES / "smollm2")
