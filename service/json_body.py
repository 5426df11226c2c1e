"""Request bodies decoded in one pass: each record's `events` array straight into columns, its
FHIR `bundle`'s resources left as JSON text.

`FastJsonRoute` is the API's route class: its requests' `json()` is `decode_body`, which gives
what `json.loads` gives except that
- a record's `events` array (top-level `events`, or `events` of each of `records`) arrives as the
  `SubjectEvents` that validating it event by event would build
  (`medtpe_core.meds_json.decode_events`); the request models take such columns as they are
  (`service.schemas.Events`);
- a record's `bundle` arrives with each entry's `resource` as its undecoded JSON text (`bytes`),
  as a CDS hook's prefetch does (`service.cds_hooks.prefetch`): `medtpe_core.fhir` decodes only
  what its first pass needs of each, and validates only the resources the prompt reaches, from
  their text.
Anything the fast path does not vouch for — malformed JSON, an invalid event, several subjects, a
Bundle whose `entry` is not a list of objects — is decoded by `json.loads` and validated as
before, so bad input gets the very same answers.
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
BUNDLE_FIELD = "bundle"
RECORDS_FIELD = "records"
ENTRY_FIELD = "entry"
RESOURCE_FIELD = "resource"

_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RECORDS = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])
_NULL = b"null"


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
        decoded = None
        if name == EVENTS_FIELD:
            decoded = decode_events(raw)
        elif name == BUNDLE_FIELD:
            decoded = _bundle(raw)
        out[name] = decoded if decoded is not None else json.loads(bytes(raw))
    return out


def _bundle(raw: msgspec.Raw) -> dict[str, Any] | None:
    """A Bundle's fields as `json.loads` reads them, but each entry's `resource` as its JSON text
    (a `null` resource: None); None when it is not an object whose `entry` is a list of objects
    (then `json.loads` reads it, and the mapping names what is wrong)."""
    try:
        fields = _FIELDS.decode(raw)
        entries = _RECORDS.decode(fields.pop(ENTRY_FIELD, b"[]"))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    out: dict[str, Any] = {name: json.loads(bytes(value)) for name, value in fields.items()}
    out[ENTRY_FIELD] = [_entry(entry) for entry in entries]
    return out


def _entry(fields: dict[str, msgspec.Raw]) -> dict[str, Any]:
    """A Bundle entry's fields, its `resource` left as JSON text."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        text = bytes(value)
        if name != RESOURCE_FIELD:
            out[name] = json.loads(text)
        else:
            out[name] = None if text == _NULL else text
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
