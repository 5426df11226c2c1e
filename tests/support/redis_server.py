"""A real `redis-server` (Debian's package; `make deps-system` installs it) on a free 127.0.0.1
port, without persistence, for the tests of the shared state
(medtpe/service/cds_hooks/state_store.py). It can be stopped and started again on the same port
mid-test (a store outage)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.service_support import free_port

REDIS_SERVER = shutil.which("redis-server")
"""The server's path; None where it is not installed."""
START_TIMEOUT_S = 10.0
STATE_KEY = "tests-state-key-of-the-instances-sharing-a-store"
"""`MEDTPE_STATE_KEY` of the test instances whose state is on a redis-server (it authenticates
their score cache's entries; every instance sharing the store has the same)."""


class RedisServer:
    """`redis-server --port N --save '' --appendonly no` on 127.0.0.1, its log in `log_path`."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        assert REDIS_SERVER is not None and self._process is None
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start:\n{self.log_path.read_text()}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop the server (SIGTERM; it keeps nothing) and wait for its exit."""
        if self._process is not None:
            self._process.terminate()
            self._process.wait(START_TIMEOUT_S)
            self._process = None

    def answers(self) -> bool:
        """Whether the server answers PING now."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False


@contextmanager
def running_redis(log_dir: Path) -> Iterator[RedisServer]:
    """A started `RedisServer`, stopped on exit."""
    server = RedisServer(log_dir / "redis-server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()
