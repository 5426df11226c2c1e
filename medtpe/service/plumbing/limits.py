"""Load limits: the request body's size and time caps (ASGI middleware) and admission control.

Admission control admits a request's records only while fewer than `max_concurrency +
queue_limit` are being served; `max_concurrency` of them generate at once, the rest wait for a
slot. Beyond that the request is refused at once (503 + Retry-After) instead of piling up.

A record counts as the prefill of one prompt. A record asked several tasks at once counts what
the engine computes for them (`tasks_cost`): its first task's prompt whole, then of each further
task's prompt only the part past the record (the head and the record all of them share are read
from the engine's prefix cache). Its tasks generate in one slot: the record prefilled once,
then every task together.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from fractions import Fraction

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from medtpe.service.plumbing.errors import field_error, send_json


class QueueFull(Exception):
    """No room for the request's records; retry after `retry_after_s`."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"queue full, retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


def tasks_cost(prompt_lengths: Sequence[int], n_shared: int) -> Fraction:
    """What several tasks' prompts about one record cost admission, in records (one prompt's
    prefill each): the first prompt whole, of each further one the share of its tokens past the
    `n_shared` leading tokens all of them share (exact, so what is admitted returns to 0)."""
    further = prompt_lengths[1:]
    return 1 + sum((Fraction(n - n_shared, n) for n in further), Fraction(0))


class Admission:
    """Counts admitted records (`tasks_cost` for a record asked several tasks) and hands out
    generation slots."""

    def __init__(self, max_concurrency: int, queue_limit: int) -> None:
        self.max_concurrency = max_concurrency
        self.capacity = max_concurrency + queue_limit
        self.admitted: int | Fraction = 0
        self._slots = asyncio.Semaphore(max_concurrency)
        self._mean_hold_s = 1.0

    @contextmanager
    def admit(self, n_records: int | Fraction) -> Iterator[None]:
        """Reserve room for `n_records` (a share of a record's prefill counts its share) for the
        duration of the block, or raise `QueueFull`."""
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


MAX_LENGTH_DIGITS = 18
"""The most digits of a `Content-Length` that are parsed (10**18 bytes: beyond any limit)."""


class BodyLimits:
    """The request body's size and arrival time, before and while it is read.

    413 for a body over `max_bytes`: by `Content-Length` at once, or as a chunked body streams in;
    a `Content-Length` of anything but ASCII digits is a 400 (more than `MAX_LENGTH_DIGITS` of
    them: 413, never parsed). 408 for a body not received in full within `deadline_s` of the
    request's start (a trickled body), the connection closed. A client that disconnects before
    its body is complete meets Starlette's `ClientDisconnect`, which
    `medtpe.service.plumbing.errors.InternalErrors` counts as the client's doing. Each refusal calls
    `on_reject` with its reason (`invalid`, `too_large`, `body_timeout`). Errors raised while the
    app reads the body become their responses through FastAPI's handlers."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        deadline_s: float,
        on_reject: Callable[[str], None],
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.deadline_s = deadline_s
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the declared length, then count the bytes received and the time they take."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():  # bytes: ASCII digits only
                self.on_reject("invalid")
                await self._refuse(send, 400, "content-length", "not a byte count")
                return
            if len(declared) > MAX_LENGTH_DIGITS or int(declared) > self.max_bytes:
                self.on_reject("too_large")
                await self._refuse(send, 413, "body", self._too_large())
                return
        deadline = asyncio.get_running_loop().time() + self.deadline_s
        received = 0
        complete = False

        async def limited_receive() -> Message:
            nonlocal received, complete
            if complete:  # the body is in: what follows is the wait for a disconnect
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                self.on_reject("body_timeout")
                raise HTTPException(
                    408,
                    f"request body not received within {self.deadline_s:g} s",
                    headers={"Connection": "close"},
                ) from None
            received += len(message.get("body", b""))
            complete = not message.get("more_body", False)
            if received > self.max_bytes:
                self.on_reject("too_large")
                raise HTTPException(413, self._too_large(), headers={"Connection": "close"})
            return message

        await self.app(scope, limited_receive, send)

    def _too_large(self) -> str:
        return f"request body over {self.max_bytes} bytes"

    async def _refuse(self, send: Send, status: int, where: str, detail: str) -> None:
        """Answer before the app runs, naming the header or the body, and close."""
        loc = ["header", where] if where != "body" else ["body"]
        error = "bad_request" if status == 400 else "too_large"
        body = {"error": error, "detail": field_error(loc, detail, error)}
        await send_json(send, status, body, [(b"connection", b"close")])
