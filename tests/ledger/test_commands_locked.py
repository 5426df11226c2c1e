"""The commands that wait on the ledger end in time: with the `predictions` table locked by
another connection (an open transaction holding ACCESS EXCLUSIVE, as a migration or an index
build does) on the session's real PostgreSQL, `medtpe outcomes`, `medtpe monitor` and `medtpe
verify` stop with one line naming the lock timeout, within `MEDTPE_LEDGER_LOCK_TIMEOUT_S` and a
margin. Every wait of theirs on the ledger is a connect or a statement, so the ledger's timeouts
are their deadline."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from medtpe.cli.main import cli
from medtpe.ledger.store import Ledger
from tests.support.ledger_rows import RFC8037_SEED_B64 as SEED
from tests.support.meds_outcomes import AT_24H, write_outcome_dataset
from tests.support.monitoring_rows import prediction
from tests.support.postgres import PostgresServer
from tests.support.server_fixtures import fresh_database

LOCK_TIMEOUT_S = 1.0
MARGIN_S = 4.0
"""Opening the ledger and starting the command, on a loaded machine."""


@pytest.fixture
def locked_ledger(postgres_server: PostgresServer) -> Iterator[tuple[str, str]]:
    """A PostgreSQL ledger holding one prediction, its `predictions` table locked while the test
    runs; (its URL, the prediction's id)."""
    url = fresh_database(postgres_server)
    ledger = Ledger.open(url)
    row = prediction(
        1, created_at=datetime(2026, 11, 2, tzinfo=UTC), subject_id="1",
        prediction_time=AT_24H, p_yes=0.3,
    )  # fmt: skip
    ledger.record([row])
    ledger.close()
    with psycopg.connect(url) as holder:
        holder.execute("LOCK TABLE predictions IN ACCESS EXCLUSIVE MODE")
        yield url, row.prediction_id
        holder.rollback()


@pytest.mark.parametrize("command", ["outcomes", "monitor", "verify"])
def test_a_locked_ledger_stops_each_command_within_its_lock_timeout(
    locked_ledger: tuple[str, str], tmp_path: Path, command: str
) -> None:
    url, prediction_id = locked_ledger
    meds = str(write_outcome_dataset(tmp_path / "meds"))
    args = {
        "outcomes": ["outcomes", "--task", "icu_mortality", "--meds", meds],
        "monitor": ["monitor", "--out", str(tmp_path / "report")],
        "verify": ["verify", prediction_id, "--signature-only"],
    }[command]
    environment = {
        "MEDTPE_LEDGER_URL": url,
        "MEDTPE_LEDGER_SIGNING_KEY": SEED,
        "MEDTPE_LEDGER_LOCK_TIMEOUT_S": str(LOCK_TIMEOUT_S),
    }
    start = time.monotonic()
    result = CliRunner().invoke(cli, args, env=environment)
    took = time.monotonic() - start
    assert result.exit_code == 1, result.output
    assert "canceling statement due to lock timeout" in result.output
    assert result.output.startswith("Error: the ledger cannot be read")
    assert "Traceback" not in result.output and len(result.output.splitlines()) == 1
    assert LOCK_TIMEOUT_S <= took < LOCK_TIMEOUT_S + MARGIN_S, took
