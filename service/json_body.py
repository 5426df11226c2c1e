"""Request bodies decoded in one pass: each record's `events` array straight into columns.

`FastJsonRoute` is the API's route class: its requests' `json()` is `decode_body`, which gives
what `json.loads` gives except that a record's `events` array (top-level `events`, or `events` of
each of `records`) arrives as the `SubjectEvents` that validating it event by event would build
(`medtpe_core.meds_json.decode_events`). The request models take such columns as they are
(`service.schemas.Events`). Anything the fast path does not vouch for — malformed JSON, an invalid
event, several subjects — is decoded by `json.loads` and validated event by event as before, so
bad input gets the very same answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec
from fastapi import Request, Response
from fastapi.routing import APIRoute

from medtpe_core.meds_json import decode_events

EVENTS_FIELD = "events"
RECORDS_FIELD = "records"

_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RECORDS = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])


def decode_body(body: bytes) -> Any:
    """`json.loads(body)`, with records' events as columns where the fast path takes them."""
    try:
        fields = _FIELDS.decode(body)
        if RECORDS_FIELD in fields:
            records = [_record(r) for r in _RECORDS.decode(fields.pop(RECORDS_FIELD))]
            return {**_record(fields), RECORDS_FIELD: records}
        return _record(fields)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
        return json.loads(body)  # not an object of objects: as before, errors included


def _record(fields: dict[str, msgspec.Raw]) -> dict[str, Any]:
    """One JSON object's fields: `events` as columns when possible, the rest as `json.loads`
    reads them."""
    out: dict[str, Any] = {}
    for name, raw in fields.items():
        columns = decode_events(raw) if name == EVENTS_FIELD else None
        out[name] = columns if columns is not None else json.loads(bytes(raw))
    return out


class FastJsonRequest(Request):
    """A request whose JSON body is read by `decode_body`."""

    async def json(self) -> Any:
        """The decoded body (cached, as Starlette does)."""
        if not hasattr(self, "_json"):
            self._json = decode_body(await self.body())
        return self._json


class FastJsonRoute(APIRoute):
    """An API route whose request body goes through `decode_body`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, given a `FastJsonRequest`."""
        handler = super().get_route_handler()

        async def fast_json_handler(request: Request) -> Response:
            return await handler(FastJsonRequest(request.scope, request.receive))

        return fast_json_handler
