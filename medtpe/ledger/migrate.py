"""The ledger's schema migrations (Alembic, shipped in `medtpe/ledger/migrations`), run
programmatically: `upgrade(engine)` brings a database to the newest schema, one process at a
time (a PostgreSQL advisory lock; a lock file beside a SQLite database)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

MIGRATIONS = Path(__file__).parent / "migrations"
_LOCK_KEY = 0x6D656474_7065  # "medtpe": the advisory lock of the ledger's migrations


def alembic_config() -> Config:
    """Alembic's configuration of the ledger's migrations (no ini file)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head() -> str:
    """The newest schema revision."""
    revision = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert revision is not None
    return revision


def current(connection: Connection) -> str | None:
    """The schema revision of the database `connection` is on (None: no ledger yet)."""
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database of `engine` to `revision` (default: the newest); nothing to do when
    it is there already."""
    with _migration_lock(engine), engine.begin() as connection:
        target = head() if revision == "head" else revision
        if current(connection) == target:
            return
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    """Held while migrating: processes opening one ledger at once migrate it one at a time."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _LOCK_KEY})
            connection.commit()
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _LOCK_KEY})
                connection.commit()
    elif engine.url.database and engine.url.database != ":memory:":
        lock = Path(engine.url.database).with_suffix(".migrating")
        with lock.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
    else:
        yield
