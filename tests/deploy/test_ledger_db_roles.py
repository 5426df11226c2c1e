"""deploy/ledger-db-roles.sql on a real PostgreSQL, as compose's `ledger-db` runs it when it
creates the database: the owner role migrates the ledger (`medtpe ledger upgrade`), then the
service's role opens it, records a prediction and its feedback and reads them back, and may not
update, delete or drop anything, nor create a table; a script without its passwords stops."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from medtpe.cli.main import cli
from medtpe.ledger.feedback import FeedbackRow, record_feedback
from medtpe.ledger.settings import LedgerSettings
from tests.support.ledger_rows import row
from tests.support.paths import ROOT
from tests.support.postgres import POSTGRES_BIN, PostgresServer

SCRIPT = ROOT / "deploy" / "ledger-db-roles.sql"
OWNER, SERVICE = "medtpe_owner", "medtpe_service"
DATABASE = "roles_ledger"
ISSUER = "https://ehr.example"


def psql(server: PostgresServer, secrets: Path, database: str) -> subprocess.CompletedProcess:
    """The script run by the server's superuser on `database`, as the image's entrypoint runs
    it, the passwords read from `secrets`."""
    assert POSTGRES_BIN is not None
    command = [str(POSTGRES_BIN / "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-f", str(SCRIPT)]
    env = os.environ | {
        "LEDGER_SECRETS_DIR": str(secrets),
        "PGHOST": "127.0.0.1",
        "PGPORT": str(server.port),
        "PGUSER": server.user,
        "PGDATABASE": database,
    }
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def as_role(server: PostgresServer, role: str) -> str:
    """The URL of the roles' database, connected as `role`."""
    return f"postgresql://{role}@127.0.0.1:{server.port}/{DATABASE}"


@pytest.fixture
def roles_database(postgres_server: PostgresServer, tmp_path: Path) -> Iterator[PostgresServer]:
    """A new database with the script's roles (dropped again afterwards: roles are the
    server's)."""
    (tmp_path / "ledger-owner-password").write_text("owner0123456789\n")
    (tmp_path / "ledger-service-password").write_text("service0123456789\n")
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {DATABASE}")
    try:
        done = psql(postgres_server, tmp_path, DATABASE)
        assert done.returncode == 0, done.stderr
        yield postgres_server
    finally:
        with psycopg.connect(postgres_server.url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
            for role in (SERVICE, OWNER):
                admin.execute(f"DROP ROLE IF EXISTS {role}")


def test_the_owner_migrates_and_the_service_only_inserts_and_selects(
    roles_database: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = roles_database
    monkeypatch.delenv("MEDTPE_LEDGER_URL", raising=False)
    migrated = CliRunner().invoke(cli, ["ledger", "upgrade", "--ledger", as_role(server, OWNER)])
    assert migrated.exit_code == 0, migrated.output

    # the service's start: the ledger is at the newest schema, nothing to migrate
    ledger = LedgerSettings(as_role(server, SERVICE), "store").open_ledger()
    try:
        made = row(1)
        ledger.record([made])
        assert ledger.get(made.prediction_id) == made
        when = datetime(2026, 1, 1)
        feedback = FeedbackRow("card-1", made.prediction_id, ISSUER, "accepted", None, when, when)
        record_feedback(ledger, [feedback])
        record_feedback(ledger, [feedback])  # an EHR's retry: nothing written twice
    finally:
        ledger.close()

    with psycopg.connect(as_role(server, SERVICE), autocommit=True) as service:
        tables = [
            name
            for (name,) in service.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            )
        ]
        assert {"predictions", "feedback", "alembic_version"} <= set(tables), tables
        for table in tables:
            assert service.execute(f"SELECT count(*) FROM {table}").fetchone() is not None
        refused = [
            "UPDATE predictions SET answer = '\"no\"'",
            "DELETE FROM predictions",
            "DELETE FROM feedback",
            "DROP TABLE predictions",
            "TRUNCATE predictions",
            "ALTER TABLE predictions ADD COLUMN forged text",
            "CREATE TABLE forged (x int)",
        ]
        for statement in refused:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                service.execute(statement)
    with psycopg.connect(as_role(server, OWNER)) as owner:
        (count,) = owner.execute("SELECT count(*) FROM predictions").fetchone()
    assert count == 1


def test_the_script_stops_without_its_passwords(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    (tmp_path / "ledger-owner-password").write_text("owner0123456789\n")
    done = psql(postgres_server, tmp_path, "postgres")
    assert done.returncode != 0
    assert "ledger-owner-password or ledger-service-password is missing or empty" in done.stderr
    with psycopg.connect(postgres_server.url) as admin:
        roles = admin.execute(
            "SELECT rolname FROM pg_roles WHERE rolname IN (%s, %s)", (OWNER, SERVICE)
        ).fetchall()
    assert roles == []
