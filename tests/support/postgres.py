"""A real PostgreSQL server (Debian's package; `make deps-system` installs it) on a free
127.0.0.1 port, in a throwaway data directory, for the ledger's tests. Its binaries
(`/usr/lib/postgresql/<version>/bin`) refuse to run as root, so as root they run as the
`postgres` user, in a folder that user owns. It can be stopped and started again on the same
port mid-test (an outage)."""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.service_support import free_port

START_TIMEOUT_S = 120
"""How long `initdb` or `pg_ctl` may take: a start under a loaded test run took over 30 s."""


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's binaries folder (None: not installed)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


POSTGRES_BIN = postgres_bin()
"""Where `initdb` and `pg_ctl` are; None where PostgreSQL is not installed."""
SKIP_REASON = "PostgreSQL is not installed (`make deps-system` installs Debian's postgresql)"


class PostgresServer:
    """`postgres` on 127.0.0.1:`port`, trust authentication, its socket and data in `root`;
    `fsync` as PostgreSQL's setting (on: each commit and checkpoint flushed to the disk)."""

    def __init__(self, root: Path, fsync: bool = True) -> None:
        assert POSTGRES_BIN is not None
        self.root = root
        self.fsync = fsync
        self.data = root / "data"
        self.port = free_port()
        self.user = "postgres"
        self.url = f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        command = [str(POSTGRES_BIN / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed:\n{done.stdout}\n{done.stderr}")

    def init(self) -> None:
        """A fresh cluster in `root/data`, owned by the `postgres` user when run as root."""
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        else:
            self.user = getpass.getuser()
            self.url = f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            self.user,
            "-E",
            "UTF8",
            "--no-sync",
        )

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        fsync = "on" if self.fsync else "off"
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync={fsync}"
        log = str(self.root / "postgres.log")
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            log,
            "-w",
            "-t",
            str(START_TIMEOUT_S - 5),
            "start",
        )

    def stop(self) -> None:
        """Stop the server (fast shutdown: open sessions are ended) and wait for it."""
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-m",
            "fast",
            "-w",
            "-t",
            str(START_TIMEOUT_S - 5),
            "stop",
        )


@contextmanager
def running_postgres(fsync: bool = True) -> Iterator[PostgresServer]:
    """A started `PostgresServer` in a fresh folder the `postgres` user can reach (not under
    root's home), stopped and removed on exit. `fsync=False` (the tests: none crashes the
    machine) spares the disk flushes of each commit and of a stop's checkpoint, which took over a
    minute of an outage test while engines loaded beside it; the benchmarks keep them."""
    root = Path(tempfile.mkdtemp(prefix="medtpe-pg-", dir="/tmp"))
    server = PostgresServer(root, fsync)
    try:
        server.init()
        server.start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
