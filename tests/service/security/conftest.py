"""Fixtures of the security tests: a real redis-server for the shared state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_server import REDIS_SERVER, RedisServer, running_redis


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server on 127.0.0.1 for the module's tests (skipped when it is not installed)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (`make deps-system` installs it)")
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server
