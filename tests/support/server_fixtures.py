"""Fixtures of real servers, for every test (tests/conftest.py imports them): a PostgreSQL server
for the session, each test's own empty ledger database on SQLite (WAL) and on PostgreSQL
(`ledger_url`), and a redis-server for a module (`redis_server`: state several instances
share)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.postgres import POSTGRES_BIN, SKIP_REASON, PostgresServer, running_postgres
from tests.support.redis_server import REDIS_SERVER, RedisServer, running_redis

__all__ = ["fresh_database", "ledger_url", "postgres_server", "redis_server"]

_DATABASES = itertools.count()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server on 127.0.0.1 for the session (skipped where it is not installed)."""
    if POSTGRES_BIN is None:
        pytest.skip(SKIP_REASON)
    with running_postgres(fsync=False) as server:
        yield server


def fresh_database(server: PostgresServer) -> str:
    """The URL of a new, empty database on `server`."""
    name = f"ledger_{next(_DATABASES)}"
    with psycopg.connect(server.url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return server.url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty ledger database: a SQLite file, or a new database on the session's
    PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    return fresh_database(request.getfixturevalue("postgres_server"))


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server on 127.0.0.1 for the module's tests (skipped when it is not installed)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (`make deps-system` installs it)")
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server
