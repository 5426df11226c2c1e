"""Load limits: the request-body size cap (ASGI middleware) and admission control.

Admission control admits a request's records only while fewer than `max_concurrency +
queue_limit` are being served; `max_concurrency` of them generate at once, the rest wait for a
slot. Beyond that the request is refused at once (503 + Retry-After) instead of piling up.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import http_error_body, send_json


class QueueFull(Exception):
    """No room for the request's records; retry after `retry_after_s`."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"queue full, retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class Admission:
    """Counts admitted records and hands out generation slots."""

    def __init__(self, max_concurrency: int, queue_limit: int) -> None:
        self.max_concurrency = max_concurrency
        self.capacity = max_concurrency + queue_limit
        self.admitted = 0
        self._slots = asyncio.Semaphore(max_concurrency)
        self._mean_hold_s = 1.0

    @contextmanager
    def admit(self, n_records: int) -> Iterator[None]:
        """Reserve room for `n_records` for the duration of the block, or raise `QueueFull`."""
        if self.admitted + n_records > self.capacity:
            raise QueueFull(self.retry_after_s())
        self.admitted += n_records
        try:
            yield
        finally:
            self.admitted -= n_records

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Wait for one of the `max_concurrency` generation slots."""
        async with self._slots:
            start = asyncio.get_running_loop().time()
            try:
                yield
            finally:
                held = asyncio.get_running_loop().time() - start
                self._mean_hold_s = 0.8 * self._mean_hold_s + 0.2 * held

    def retry_after_s(self) -> int:
        """Seconds until a slot is likely free: one mean generation per queued wave."""
        waves = max(1, math.ceil(self.admitted / self.max_concurrency))
        return max(1, math.ceil(self._mean_hold_s * waves))


class BodySizeLimit:
    """413 for bodies over `max_bytes`: by `Content-Length` at once, or as a chunked body streams
    in (then FastAPI turns the raised `HTTPException` into the response)."""

    def __init__(self, app: ASGIApp, max_bytes: int, on_reject: Callable[[], None]) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the declared length, then count the bytes actually received."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    self.on_reject()
                    raise HTTPException(413, self._detail())
            return message

        await self.app(scope, counting_receive, send)

    def _detail(self) -> str:
        return f"request body over {self.max_bytes} bytes"

    async def _reject(self, send: Send) -> None:
        self.on_reject()
        body = http_error_body(413, self._detail())
        await send_json(send, 413, body, [(b"connection", b"close")])
