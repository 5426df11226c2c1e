"""No answer without its row, under load and faults: four API processes (two replicas of two
processes each, every one the app on the instant engine on its own port) write to one real
PostgreSQL while clients send `/predict` concurrently; one API process is SIGKILLed mid-run and
PostgreSQL is stopped mid-run, then started again. Every answer a client received (200 with a
prediction id) has exactly one row saying the same answer and p("yes"), no id comes twice,
and the requests during the outage got 503 `ledger_unavailable`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from medtpe.ledger.store import Ledger
from tests.support.ledger_rows import RFC8037_SEED_B64 as SEED
from tests.support.paths import ROOT
from tests.support.polling import wait_for
from tests.support.postgres import PostgresServer
from tests.support.server_fixtures import fresh_database
from tests.support.service_support import SERVICE_API_KEY, free_port, record, service_env

pytestmark = pytest.mark.slow

API_PROCESSES = 4
CLIENTS = 8
READY_TIMEOUT_S = 40
AUTH = {"Authorization": f"Bearer {SERVICE_API_KEY}"}
PHASE_ANSWERS = 100
"""Answers each phase of the run waits for (before the kill, after it, after the outage): a few
hundred in all from the eight clients."""
PHASE_TIMEOUT_S = 60
"""How long a phase of the run (before the kill, after it, the outage, after it) may wait for
its events: answers, or the ledger's refusals (one per client) in the outage."""
PHASE_POLL_S = 0.05
"""How often a phase looks at what the clients have received."""
PAUSE_S = 0.05
"""A client's pause after a refusal or a dead process, as a client that backs off would: clients
retrying at once kept the worker's core so busy that PostgreSQL took over a minute to start
again in a full test run."""


@pytest.fixture
def api_processes(
    service_files: tuple[Path, Path], postgres_server: PostgresServer, tmp_path: Path
) -> Iterator[tuple[list[subprocess.Popen], list[str], str]]:
    """Four API processes on one fresh PostgreSQL ledger, ready; killed on exit."""
    url = fresh_database(postgres_server)
    env = {
        **os.environ,
        **service_env(service_files),
        "MEDTPE_API_KEYS": SERVICE_API_KEY,
        "MEDTPE_LEDGER_URL": url,
        "MEDTPE_LEDGER_SIGNING_KEY": SEED,
    }
    ports = [free_port() for _ in range(API_PROCESSES)]
    logs = [(tmp_path / f"api-{port}.log").open("wb") for port in ports]
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.instant_app", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for port, log in zip(ports, logs, strict=True)
    ]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        with httpx.Client(timeout=2) as client:  # one TLS context for every poll
            for process, base in zip(processes, urls, strict=True):
                while not _ready(client, base):
                    assert process.poll() is None, (tmp_path / f"api-{base[-5:]}.log").read_text()
                    assert time.monotonic() < deadline, "API processes not ready"
                    time.sleep(0.1)
        yield processes, urls, url
    finally:
        for process in processes:
            process.kill()
            process.wait()
        for log in logs:
            log.close()


def _ready(client: httpx.Client, base: str) -> bool:
    try:
        return client.get(base + "/readyz").status_code == 200
    except httpx.TransportError:
        return False


def test_every_answer_received_has_exactly_one_row_through_a_kill_and_an_outage(
    api_processes: tuple[list[subprocess.Popen], list[str], str],
    postgres_server: PostgresServer,
) -> None:
    processes, urls, url = api_processes
    received: list[dict] = []
    refused: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(index: int) -> None:
        with httpx.Client(timeout=10, headers=AUTH) as http:
            n = 0
            while not stop.is_set():
                base = urls[(index + n) % len(urls)]
                body = record(1000 * index + n, 20, options={"return_probabilities": True})
                n += 1
                try:
                    answer = http.post(base + "/predict", json=body)
                except httpx.TransportError:  # the killed process: no answer received
                    stop.wait(PAUSE_S)
                    continue
                with lock:
                    if answer.status_code == 200:
                        received.append(answer.json())
                    else:
                        refused.append(answer.json().get("error", str(answer.status_code)))
                if answer.status_code != 200:
                    stop.wait(PAUSE_S)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            "answers before the kill",
            lambda: len(received) >= PHASE_ANSWERS,
            PHASE_TIMEOUT_S,
            poll_s=PHASE_POLL_S,
        )
        killed_at = len(received)
        processes[1].send_signal(signal.SIGKILL)  # one API process of the first replica
        wait_for(
            "answers after the kill",
            lambda: len(received) >= killed_at + PHASE_ANSWERS,
            PHASE_TIMEOUT_S,
            poll_s=PHASE_POLL_S,
        )
        before_outage = len(received)
        postgres_server.stop()
        wait_for(
            "refusals in the outage",
            lambda: refused.count("ledger_unavailable") >= CLIENTS,
            PHASE_TIMEOUT_S,
            poll_s=PHASE_POLL_S,
        )
        during_outage = len(received)
        postgres_server.start()
        wait_for(
            "answers after the outage",
            lambda: len(received) >= during_outage + PHASE_ANSWERS,
            PHASE_TIMEOUT_S,
            poll_s=PHASE_POLL_S,
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert before_outage > 0 and len(received) > during_outage  # answers before and after
    assert refused.count("ledger_unavailable") > 0, refused
    assert set(refused) <= {"ledger_unavailable"}, refused

    ids = [body["prediction_id"] for body in received]
    assert len(set(ids)) == len(ids)  # nothing answered twice under one id
    ledger = Ledger.open(url)
    try:
        rows = {row.prediction_id: row for row in ledger.rows()}
    finally:
        ledger.close()
    for body in received:  # exactly one row (the primary key), saying what the body says
        row = rows[body["prediction_id"]]
        assert json.loads(row.answer) == body["prediction"]
        assert row.p_yes == body["probabilities"]["yes"]
        assert json.loads(row.receipt) == body["receipt"]["receipt"]
        assert row.signature == body["receipt"]["signature"]
    # a row without a received answer: committed as its process was killed, or as PostgreSQL
    # stopped before the commit's acknowledgement (each at most one request per client)
    assert len(rows) - len(received) <= 2 * CLIENTS
