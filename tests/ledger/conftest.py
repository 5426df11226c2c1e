"""Fixtures of the ledger's tests: a real PostgreSQL server for the session, each test's own
empty ledger database on SQLite (WAL) and on PostgreSQL (`ledger_url`), and the security tests'
redis-server (`redis_server`: state several instances share)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.service.security.conftest import redis_server
from tests.support.postgres import POSTGRES_BIN, SKIP_REASON, PostgresServer, running_postgres

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
