"""API errors: one exception type carrying status, error code and detail, one JSON body shape
(`{"error": code, "detail": ...}`), and the handlers that count rejections by reason."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from service.metrics import ServiceMetrics

_HTTP_CODES = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}


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
        error = _HTTP_CODES.get(exc.status_code, "http_error")
        return JSONResponse(_body(error, str(exc.detail)), exc.status_code, headers=exc.headers)
