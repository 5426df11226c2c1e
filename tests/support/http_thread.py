"""A test's own HTTP server on 127.0.0.1, served from a thread while a block runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def serving_in_thread(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    """A `ThreadingHTTPServer` of `handler` on a free port of 127.0.0.1 while the block runs
    (`server.server_address[1]` is the port); shut down and closed after it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    # polled every 50 ms, so a stop takes that long at most (the default 0.5 s, once per server)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
