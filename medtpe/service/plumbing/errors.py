"""API errors: one exception type carrying status, error code and detail, one JSON body shape
(`{"error": code, "detail": ...}`), the handlers that count rejections by reason, and the last
resort (`InternalErrors`): an exception no handler answers is a generic 500, logged by type and
route only; a client gone before its body arrived is counted as the client's doing."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from medtpe.service.plumbing.metrics import ServiceMetrics

logger = logging.getLogger("medtpe.service")

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    408: "body_timeout",
    413: "too_large",
}
_HTTP_LOCS = {400: "body", 404: "path", 405: "method", 408: "body", 413: "body"}
"""Where the request is wrong, by the status Starlette or FastAPI answered."""
INTERNAL_BODY = {"error": "internal", "detail": "internal error"}


class ApiError(Exception):
    """An error answer: HTTP status, machine-readable code, human-readable detail."""

    def __init__(
        self,
        status: int,
        error: str,
        detail: str | list[dict[str, Any]],
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers


def field_error(loc: Sequence[str | int], msg: str, type_: str) -> list[dict[str, Any]]:
    """A one-item validation detail naming the offending field."""
    return [{"loc": list(loc), "msg": msg, "type": type_}]


def _body(error: str, detail: str | list[dict[str, Any]]) -> dict[str, Any]:
    return {"error": error, "detail": detail}


def http_error_body(status: int, detail: str) -> dict[str, Any]:
    """The body of an HTTP error Starlette, FastAPI or a middleware raises: its code, and the
    detail located where the status says the request is wrong."""
    error = _HTTP_CODES.get(status, "http_error")
    where = _HTTP_LOCS.get(status)
    return _body(error, field_error([where], detail, error) if where else detail)


class InternalErrors:
    """The last resort, inside Starlette's own: an exception nothing answered becomes a 500
    with a generic body, logged with its type and route only (its message and the request may
    hold record content), and counted as `internal`; never raised further (so the server logs
    nothing of it either). A client that disconnected before its body was complete
    (`ClientDisconnect`) gets no answer and is counted by `on_disconnect`: the client's doing,
    not an internal error."""

    def __init__(
        self, app: ASGIApp, on_error: Callable[[], None], on_disconnect: Callable[[], None]
    ) -> None:
        self.app = app
        self.on_error = on_error
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app; answer an escaped exception with the 500, if nothing was sent yet."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            self.on_disconnect()
        except Exception as exc:
            route = scope.get("route")
            where = getattr(route, "path", "unrouted")
            logger.error("internal error %s on %s %s", type(exc).__name__, scope["method"], where)
            self.on_error()
            if not started:
                await send_json(send, 500, INTERNAL_BODY)


async def send_json(
    send: Send, status: int, body: dict[str, Any], headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Answer with `body` as JSON straight over ASGI (a middleware's own answer)."""
    content = json.dumps(body).encode()
    start = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(content)),
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": content})


def install_error_handlers(app: FastAPI, metrics: ServiceMetrics) -> None:
    """JSON bodies for every error; schema errors keep their field path but not the input."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(_body(exc.error, exc.detail), exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.rejections.labels("invalid").inc()
        detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse(_body("invalid_request", detail), 422)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        body = http_error_body(exc.status_code, str(exc.detail))
        return JSONResponse(body, exc.status_code, headers=exc.headers)
