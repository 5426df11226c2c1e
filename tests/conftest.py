"""Shared fixtures. The service fixtures start real `medtpe serve` processes (vLLM engine on the
default model), once per session: engine start-up dominates their cost."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock
from hypothesis import HealthCheck, settings
from starlette.testclient import TestClient

from medtpe_core.base_tokenizer import BaseTokenizer
from medtpe_core.chat_template import ChatTemplate
from medtpe_core.meds_readers import MedsDataset
from medtpe_core.render import render_record
from tests.support.meds_fixtures import train_tokenizer
from tests.support.paths import FIXTURES
from tests.support.service_support import (
    SERVICE_API_KEY,
    Api,
    ServedApi,
    ServiceProcess,
    instant_client,
    instant_settings,
    running_service,
    service_artefact,
    service_env,
)

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The test that stops the session's service runs after every other test (whatever the
    order of the directories), so every real-engine test before it shares that one service."""
    items.sort(key=lambda item: item.get_closest_marker("stops_service") is not None)


@pytest.fixture(scope="session")
def service_files() -> tuple[Path, Path]:
    """(artefact dir, export dir) the service tests run on, prepared once (under a file lock:
    test runs side by side may prepare the same cache at the same time)."""
    from medtpe_core.paths import cache_dir

    cache = cache_dir() / "test-fixtures"
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(cache / "service-files.lock"):
        return service_artefact(cache)


@pytest.fixture(scope="session")
def service_server(
    service_files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """The service with API keys and a 256 KiB body limit (stopped by the shutdown test)."""
    env = service_env(
        service_files,
        MEDTPE_API_KEYS=f"{SERVICE_API_KEY},test-key-2",
        MEDTPE_MAX_REQUEST_BYTES=str(256 * 1024),
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
