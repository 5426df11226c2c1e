"""A ledger whose `predictions` table another connection holds locked (as a migration or an index
build does) on the session's real PostgreSQL, the app in-process on the instant engine: every
`/predict` is a 503 `ledger_unavailable` within the request deadline, after the ledger's lock
timeout, while `/tokenize` and `/readyz` keep answering at once (the ledger's writes run on its
own bounded pool, not the default executor's threads); the pool refuses a call past its bound."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from medtpe.service.plumbing.ledger_writes import LedgerPool, LedgerPoolFull
from tests.support.ledger_rows import RFC8037_SEED_B64 as SEED
from tests.support.postgres import PostgresServer
from tests.support.server_fixtures import fresh_database
from tests.support.service_support import instant_client, instant_settings, post, record

LOCK_TIMEOUT_S = 2.0
"""The ledger's lock timeout under test: twice `ANSWERED_AT_ONCE_S`, so that a write holding a
thread the other doors need would hold it past that bound. The writes wait in rounds of it (four
threads, one waiting on the table, the others behind it for the chain's lock): the slowest of
`CONCURRENT` calls answers after about four."""
DEADLINE_S = 20.0
"""The request deadline of the app under test (`MEDTPE_REQUEST_TIMEOUT_S`)."""
ANSWERED_AT_ONCE_S = 1.0
"""`/tokenize` and `/readyz` together, while the writes wait (without a pool of the ledger's own:
until a write times out)."""
WAITING = 4
"""Writes (all the ledger's threads) seen waiting on a lock before `/tokenize` and `/readyz`."""
CONCURRENT = min(32, (os.cpu_count() or 1) + 4) + 2
"""More `/predict` calls at once than the event loop's default executor has threads."""


@pytest.fixture
def locked_url(postgres_server: PostgresServer) -> Iterator[tuple[str, Callable[[], None]]]:
    """A new ledger database, and a function that locks its `predictions` table (an open
    transaction holding ACCESS EXCLUSIVE, as a migration does) until the test ends."""
    url = fresh_database(postgres_server)
    lock_now, locked, done = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        if not lock_now.wait(60):
            return
        with psycopg.connect(url) as connection:
            connection.execute("LOCK TABLE predictions IN ACCESS EXCLUSIVE MODE")
            locked.set()
            done.wait(60)
            connection.rollback()

    def lock() -> None:
        lock_now.set()
        assert locked.wait(10), "the table was not locked"

    holder = threading.Thread(target=hold)
    holder.start()
    yield url, lock
    done.set()
    lock_now.set()
    holder.join(10)


def test_a_locked_table_is_a_503_in_time_and_the_other_doors_answer(
    service_files: tuple[Path, Path], locked_url: tuple[str, Callable[[], None]]
) -> None:
    url, lock = locked_url
    settings = instant_settings(
        service_files,
        ledger_url=url,
        ledger_signing_key=SEED,
        ledger_lock_timeout_s=LOCK_TIMEOUT_S,
        ledger_statement_timeout_s=2 * LOCK_TIMEOUT_S,
        request_timeout_s=DEADLINE_S,
    )
    with instant_client(settings) as client:
        assert post(client, "/predict", record(1)).status_code == 200  # the ledger is open
        lock()

        def predict(subject: int) -> tuple[int, str, float]:
            start = time.monotonic()
            answer = post(client, "/predict", record(subject))
            return answer.status_code, answer.json().get("error", ""), time.monotonic() - start

        with ThreadPoolExecutor(CONCURRENT) as callers:
            waiting = [callers.submit(predict, 10 + i) for i in range(CONCURRENT)]
            assert _writes_waiting(url, WAITING)
            start = time.monotonic()
            tokenized = post(client, "/tokenize", {"text": "Heart rate 87 bpm"})
            ready = client.get("/readyz")
            other_doors_s = time.monotonic() - start
            answers = [call.result() for call in waiting]
    assert tokenized.status_code == 200, tokenized.text
    assert ready.status_code == 200 and ready.json()["ledger"]["status"] == "open"
    assert other_doors_s < ANSWERED_AT_ONCE_S, other_doors_s
    assert {(status, error) for status, error, _ in answers} == {(503, "ledger_unavailable")}
    slowest = max(seconds for _, _, seconds in answers)
    assert LOCK_TIMEOUT_S <= slowest < DEADLINE_S, slowest


def _writes_waiting(url: str, at_least: int) -> bool:
    """Whether `at_least` connections come to wait for a lock together (within the request
    deadline): one for the `predictions` table, the others behind it for the chain's lock."""
    deadline = time.monotonic() + DEADLINE_S
    with psycopg.connect(url, autocommit=True) as connection:
        while time.monotonic() < deadline:
            (count,) = connection.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted"
            ).fetchone()
            if count >= at_least:
                return True
            time.sleep(0.02)
    return False


def test_the_ledger_pool_refuses_a_call_past_its_bound_and_frees_its_places() -> None:
    pool = LedgerPool(threads=1, queue=1)
    release = threading.Event()

    async def scenario() -> list[object]:
        held = [asyncio.ensure_future(pool.run(release.wait, 10)) for _ in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(LedgerPoolFull, match=r"2 ledger calls are running or waiting"):
            await pool.run(release.wait, 10)
        release.set()
        done = await asyncio.gather(*held)
        return [*done, pool.held, await pool.run(sum, [1, 2])]

    assert asyncio.run(scenario()) == [True, True, 0, 3]
    pool.shutdown()
