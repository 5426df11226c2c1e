"""A FHIR server that answers whatever a test tells it, for the tests of the CDS Hooks fetch
(medtpe/service/cds_hooks/fhir_fetch.py) and of the write-back (medtpe/batch/write_back.py): a
ThreadingHTTPServer on 127.0.0.1 in a thread that records every request it gets (a GET, or a POST
whose body it reads; path with query, `Authorization` header) and answers each with the
test's `Answer`: any status, headers and bytes, streamed in repeats without a length, or dripped
slowly; it notes how many body bytes it sent and whether the client closed the connection
before the end. Also how a test reads the service's audit lines back from the log."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from tests.support.http_thread import serving_in_thread

STREAM_SEND_BUFFER = 256 * 1024
"""Socket send buffer of a streamed answer: a client that stops reading stops the sending soon.
Above a loopback segment (64 KiB), so that more than one is in flight: with one, each waits for
the reader's delayed acknowledgement, and 16 MiB took seconds instead of a tenth of one."""


@dataclass(frozen=True)
class Answer:
    """One answer: status, headers, and `body` sent `repeat` times (more than once: without a
    Content-Length, the end of the body is the connection's), `pause_s` between repeats."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    repeat: int = 1
    pause_s: float = 0.0

    @classmethod
    def json(cls, value: Any, status: int = 200) -> Answer:
        """`value` as a FHIR JSON answer."""
        headers = {"Content-Type": "application/fhir+json"}
        return cls(status, json.dumps(value).encode(), headers)


@dataclass(frozen=True)
class Seen:
    """A request the server got."""

    path: str
    authorization: str | None


@dataclass
class HostileFhir:
    """The server's base URL (`{origin}/fhir`), what it answers (`respond`, by request path),
    what it got, and how its last streamed answer ended."""

    origin: str
    respond: Callable[[str], Answer] = lambda path: Answer(404)
    requests: list[Seen] = field(default_factory=list)
    sent: int = 0
    broken: bool = False

    @property
    def url(self) -> str:
        """The FHIR base URL."""
        return self.origin + "/fhir"

    def answer_all(self, answer: Answer) -> None:
        """Answer every request with `answer`, forgetting the requests seen so far."""
        self.respond = lambda path: answer
        self.requests.clear()
        self.sent, self.broken = 0, False


@contextmanager
def hostile_fhir() -> Iterator[HostileFhir]:
    """A `HostileFhir` serving on 127.0.0.1 (a free port) while the block runs."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.do_GET()

        def do_GET(self) -> None:
            fhir.requests.append(Seen(self.path, self.headers.get("Authorization")))
            answer = fhir.respond(self.path)
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            if answer.repeat == 1:
                self.send_header("Content-Length", str(len(answer.body)))
            else:
                sock = self.connection
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SEND_BUFFER)
            self.end_headers()
            try:
                for _ in range(answer.repeat):
                    self.wfile.write(answer.body)
                    fhir.sent += len(answer.body)
                    time.sleep(answer.pause_s)
            except (BrokenPipeError, ConnectionResetError):
                fhir.broken = True

        def log_message(self, *args: object) -> None:
            pass

    with serving_in_thread(Handler) as server:
        fhir = HostileFhir(f"http://127.0.0.1:{server.server_address[1]}")
        yield fhir


def audit_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The audit lines (logger `medtpe.audit`) captured so far, decoded."""
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "medtpe.audit"]
