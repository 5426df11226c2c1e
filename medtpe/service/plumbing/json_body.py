"""Request bodies decoded in one pass: each record's `events` array straight into columns, its
FHIR `bundle`'s resources left as JSON text.

`FastJsonRoute` is the API's route class: its requests' `json()` is `decode_body`, which gives
what `json.loads` gives except that
- a record's `events` array (top-level `events`, or `events` of each of `records`) arrives as the
  `SubjectEvents` that validating it event by event would build
  (`medtpe.core.meds.json_events.decode_events`); the request models take such columns as they are
  (`medtpe.service.predict.schemas.Events`);
- a record's `bundle` arrives with each entry's `resource` as its undecoded JSON text (`bytes`),
  as a CDS hook's prefetch does (`medtpe.service.cds_hooks.prefetch`): `medtpe.core.fhir` decodes
  only what its first pass needs of each, and validates only the resources the prompt reaches, from
  their text.
Anything the fast path does not vouch for — malformed JSON, an invalid event, several subjects, a
Bundle whose `entry` is not a list of objects — is decoded by `json.loads` and validated as
before, so bad input gets the very same answers.

A body that is no JSON text this service reads — not UTF-8, nested deeper than the decoders go,
a string holding a lone surrogate (no Unicode text) — raises `UnreadableBody`, never anything
else. The body is checked to be UTF-8 as a whole first: resources kept as JSON text are decoded
later, by code that takes them as UTF-8. `FastJsonRoute` runs its `before_body` checks (the API
key: `medtpe.service.predict.routes`), then reads and decodes the body, answering what it cannot
read (and malformed JSON) with a 422 `json_invalid` locating it, then hands the request to FastAPI.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Sequence
from email.message import Message
from typing import Any

import msgspec
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from medtpe.core.meds.json_events import decode_events

EVENTS_FIELD = "events"
BUNDLE_FIELD = "bundle"
RECORDS_FIELD = "records"
ENTRY_FIELD = "entry"
RESOURCE_FIELD = "resource"

_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RECORDS = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])
_NULL = b"null"

Loc = Sequence[str | int]
NESTED_TOO_DEEPLY = "JSON nested deeper than the decoder goes"


class UnreadableBody(ValueError):
    """A body, or a field of it at `loc` (below `body`), that is no JSON text this service
    reads; `reason` says why without quoting it."""

    def __init__(self, reason: str, loc: Loc = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.loc = tuple(loc)

    def validation_error(self) -> RequestValidationError:
        """The 422 `json_invalid` error locating it."""
        error = {"type": "json_invalid", "loc": ("body", *self.loc), "msg": self.reason}
        return RequestValidationError([error])


def require_utf8(body: bytes) -> None:
    """`UnreadableBody` unless `body` is UTF-8 (RFC 8259), where parts of it stay JSON text
    that is decoded later."""
    try:
        body.decode()
    except UnicodeDecodeError as exc:
        raise UnreadableBody(f"the body is not UTF-8 (byte {exc.start})") from None


def _loads(body: bytes) -> Any:
    """`json.loads(body)` (NaN and Infinity included, as Python reads them), or `UnreadableBody`
    for a body nested past the decoder's depth, in no encoding it detects, or holding a lone
    surrogate; malformed JSON raises `json.JSONDecodeError`, as `json.loads` does."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise UnreadableBody(NESTED_TOO_DEEPLY) from None
    except UnicodeDecodeError as exc:
        raise UnreadableBody(f"the body is in no Unicode encoding (byte {exc.start})") from None
    if _lone_surrogate(value):
        raise UnreadableBody("a string holds a lone surrogate (no Unicode text)")
    return value


def strict_loads(text: bytes | msgspec.Raw, loc: Loc = ()) -> Any:
    """The JSON value of `text` (msgspec: strict JSON, UTF-8, no lone surrogate), else
    `UnreadableBody` at `loc`."""
    try:
        return msgspec.json.decode(text)
    except RecursionError:
        raise UnreadableBody(NESTED_TOO_DEEPLY, loc) from None
    except UnicodeDecodeError as exc:
        raise UnreadableBody(f"not UTF-8 (byte {exc.start})", loc) from None
    except msgspec.DecodeError as exc:
        raise UnreadableBody(f"JSON decode error: {exc}", loc) from None


def _lone_surrogate(value: Any) -> bool:
    """Whether a decoded JSON value holds a string with a lone surrogate (walked without
    recursion: the value may be nested as deep as the decoder went)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode()
                except UnicodeEncodeError:
                    return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def decode_body(body: bytes) -> Any:
    """`json.loads(body)`, with records' events as columns where the fast path takes them
    (`UnreadableBody` for text no JSON decoder here reads, see the module docstring)."""
    require_utf8(body)
    try:
        fields = _FIELDS.decode(body)
        if RECORDS_FIELD in fields:
            records = [_record(r) for r in _RECORDS.decode(fields.pop(RECORDS_FIELD))]
            return {**_record(fields), RECORDS_FIELD: records}
        return _record(fields)
    except (ValueError, RecursionError):  # msgspec's errors are ValueErrors
        return _loads(body)  # not an object of objects: as before, errors included


def _record(fields: dict[str, msgspec.Raw]) -> dict[str, Any]:
    """One JSON object's fields: `events` as columns when possible, the rest as `json.loads`
    reads them (msgspec: the same values for strict JSON; it raises on anything else, and then
    `json.loads` reads the whole body)."""
    out: dict[str, Any] = {}
    for name, raw in fields.items():
        decoded = None
        if name == EVENTS_FIELD:
            decoded = decode_events(raw)
        elif name == BUNDLE_FIELD:
            decoded = _bundle(raw)
        out[name] = decoded if decoded is not None else msgspec.json.decode(raw)
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
    out: dict[str, Any] = {name: msgspec.json.decode(value) for name, value in fields.items()}
    out[ENTRY_FIELD] = [_entry(entry) for entry in entries]
    return out


def _entry(fields: dict[str, msgspec.Raw]) -> dict[str, Any]:
    """A Bundle entry's fields, its `resource` left as JSON text."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        text = bytes(value)
        if name != RESOURCE_FIELD:
            out[name] = msgspec.json.decode(text)
        else:
            out[name] = None if text == _NULL else text
    return out


def _json_content(request: Request) -> bool:
    """Whether FastAPI reads the request's body as JSON: a JSON media type
    (`application/json`, `application/*+json`)."""
    content_type = request.headers.get("content-type")
    if not content_type:
        return False
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


class FastJsonRequest(Request):
    """A request whose JSON body is read by `decode_body`."""

    async def json(self) -> Any:
        """The decoded body (cached, as Starlette does)."""
        if not hasattr(self, "_json"):
            self._json = decode_body(await self.body())
        return self._json

    async def read_json(self) -> None:
        """Read and decode a JSON body now (a 422 `json_invalid` locating what cannot be
        read), so no decoding error reaches FastAPI, which answers those it does not know
        with 400 and no location."""
        if not _json_content(self):
            return
        body = await self.body()
        if not body:
            return
        try:
            await self.json()
        except UnreadableBody as exc:
            raise exc.validation_error() from None
        except json.JSONDecodeError as exc:
            detail = f"JSON decode error: {exc.msg} (character {exc.pos})"
            error = {"type": "json_invalid", "loc": ("body",), "msg": detail}
            raise RequestValidationError([error]) from None


class FastJsonRoute(APIRoute):
    """An API route whose request body goes through `decode_body`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, given a `FastJsonRequest` whose body is read first."""
        handler = super().get_route_handler()

        async def fast_json_handler(request: Request) -> Response:
            fast = FastJsonRequest(request.scope, request.receive)
            await self.before_body(fast)
            await fast.read_json()
            return await handler(fast)

        return fast_json_handler

    async def before_body(self, request: Request) -> None:
        """What runs before the body is read (nothing here; `medtpe.service.predict.routes` checks
        the API key)."""
