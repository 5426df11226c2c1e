"""A command that reads the ledger (`medtpe verify`, `outcomes`, `monitor`) given a SQLite path
of no file (a typo) stops with a usage error naming the path (exit status 2) and creates
nothing, whether the path comes from `--ledger` or `MEDTPE_LEDGER_URL`; the writers (`medtpe
ledger upgrade` here) still create the ledger, which the readers then open. A PostgreSQL
database that does not exist is one `Error:` line (exit status 1)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from medtpe.cli.main import cli
from tests.support.postgres import PostgresServer


def readers(out: Path) -> dict[str, list[str]]:
    """The argument lists of the commands that read the ledger, but for `--ledger`."""
    return {
        "verify": ["verify", str(uuid.uuid4()), "--signature-only"],
        "outcomes": ["outcomes", "--task", "icu_mortality", "--meds", str(out)],
        "monitor": ["monitor", "--out", str(out / "report")],
    }


@pytest.mark.parametrize("command", ["verify", "outcomes", "monitor"])
def test_a_reader_refuses_a_sqlite_ledger_that_does_not_exist(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MEDTPE_LEDGER_URL", raising=False)
    monkeypatch.setenv("MEDTPE_CACHE_DIR", str(tmp_path / "cache"))  # a key file, if any, here
    typo = tmp_path / "ledgr" / "ledger.sqlite3"
    args = readers(tmp_path)[command]
    given = CliRunner().invoke(cli, [*args, "--ledger", f"sqlite:///{typo}"])
    monkeypatch.setenv("MEDTPE_LEDGER_URL", f"sqlite:///{typo}")
    from_environment = CliRunner().invoke(cli, args)
    for run in (given, from_environment):
        assert run.exit_code == 2, run.output
        errors = [line for line in run.output.splitlines() if line.startswith("Error:")]
        assert errors == [
            f"Error: Invalid value for --ledger: no ledger at {typo}: check "
            "MEDTPE_LEDGER_URL or --ledger (a SQLite ledger is created by the service, `medtpe "
            "predict` or `medtpe ledger upgrade`)"
        ]
        assert "Traceback" not in run.output
    assert not typo.parent.exists()
    assert not (tmp_path / "cache").exists()


def test_the_writers_create_the_ledger_the_readers_then_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MEDTPE_LEDGER_URL", raising=False)
    monkeypatch.setenv("MEDTPE_CACHE_DIR", str(tmp_path / "cache"))
    new = tmp_path / "new" / "ledger.sqlite3"
    url = f"sqlite:///{new}"
    created = CliRunner().invoke(cli, ["ledger", "upgrade", "--ledger", url])
    assert created.exit_code == 0, created.output
    assert new.is_file()
    read = CliRunner().invoke(cli, [*readers(tmp_path)["verify"], "--ledger", url])
    assert read.exit_code == 1 and read.output.startswith("Error: no prediction "), read.output
    report = CliRunner().invoke(cli, [*readers(tmp_path)["monitor"], "--ledger", url])
    assert report.exit_code == 0, report.output


def test_a_postgresql_database_that_does_not_exist_is_one_error_line(
    postgres_server: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MEDTPE_LEDGER_URL", raising=False)
    url = postgres_server.url.rsplit("/", 1)[0] + "/no_such_ledger"
    for command, args in readers(tmp_path).items():
        run = CliRunner().invoke(cli, [*args, "--ledger", url])
        assert run.exit_code == 1, (command, run.output)
        assert run.output.count("\n") == 1, (command, run.output)
        assert run.output.startswith("Error: the ledger cannot be opened: "), run.output
        assert 'database "no_such_ledger" does not exist' in run.output
