"""A hook call's FHIR resources: what the CDS client prefetched, and what it left out fetched
from its FHIR server (CDS Hooks 2.0.1, "Providing FHIR Resources to a CDS Service").

Per prefetch key of the service: a value (a resource, or a Bundle whose further pages are
fetched) is used as sent; `null` means the client has no such data; a missing key, or an
OperationOutcome in its place (the client's fetch failed), is fetched with the call's
`fhirServer` and `fhirAuthorization` (`medtpe.service.cds_hooks.fhir_fetch`: only from that server,
which must be one of the issuer's `fhir_servers`, within the call's time, byte and resource limits,
each context value URL-encoded into the query). Without those, or when the server cannot
answer, the call is refused with 412 Precondition Failed, as the specification requires: one
reason, `fhir_unavailable`, whatever failed (the detail goes to the audit line only: the reasons
would tell a caller which hosts and ports answer); a prefetched value that is no FHIR resource
is a 422 naming its key.

The resources are gathered as JSON text: a prefetched Bundle's entries are cut out of the text
the client sent without decoding them (msgspec), fetched ones are kept as the text the FHIR
server sent.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

import httpx
import msgspec

from medtpe.core.cds.services import CdsService, TemplateError, render_template
from medtpe.core.fhir import FhirInputError
from medtpe.service.cds_hooks.audit import AuditedError
from medtpe.service.cds_hooks.fhir_fetch import (
    FetchLimits,
    FhirFetchError,
    FhirSource,
    FhirValue,
    ServerBase,
    fetch_all,
    next_link,
)
from medtpe.service.cds_hooks.jwt_auth import ANY_FHIR_SERVER, Caller
from medtpe.service.cds_hooks.schemas import HookRequest
from medtpe.service.plumbing.errors import ApiError, field_error
from medtpe.service.settings import ServiceSettings

PAGE_SIZE = 500
"""`_count` of the searches the service runs itself."""
FHIR_UNAVAILABLE = "fhir_unavailable"
FHIR_UNAVAILABLE_TEXT = (
    "prefetch data left out could not be fetched from fhirServer (CDS Hooks: 412); the reason "
    "is in the service's audit log"
)
"""The 412's error code and detail for every failure of a fetch: nothing of the network."""

Loc = tuple[str | int, ...]


@dataclass
class Gathered:
    """The call's resources in order, each as its JSON text, where they came from (for error
    messages: `origin`), and the time spent fetching."""

    resources: list[bytes] = field(default_factory=list)
    places: list[tuple[int, Loc, list[int] | None]] = field(default_factory=list)
    """(index of the first resource, where, each resource's Bundle entry or None) per source."""
    fetch_s: float = 0.0

    def add(self, resources: list[tuple[int, bytes]], where: Loc, in_bundle: bool) -> None:
        """Append `resources` ((entry index, JSON text)), located under `where` (as Bundle
        entries when `in_bundle`)."""
        entries = [i for i, _ in resources] if in_bundle else None
        self.places.append((len(self.resources), where, entries))
        self.resources.extend(text for _, text in resources)

    def origin(self, index: int) -> Loc:
        """Where the `index`-th resource is in the call."""
        place = bisect.bisect_right([first for first, _, _ in self.places], index) - 1
        first, where, entries = self.places[place]
        return where if entries is None else (*where, "entry", entries[index - first], "resource")

    def locate(self, error: FhirInputError | None) -> Loc:
        """Where in the call the mapping's `error` lies (the prefetch key and entry, or the
        fetch that brought the resource); None (no event of the patient): the prefetch."""
        if error is None or error.index is None:
            return ("body", "prefetch")
        return (*self.origin(error.index), *error.loc[1:])


_VALUE = msgspec.json.Decoder(FhirValue)
_MISSING = FhirValue(resourceType="OperationOutcome")
"""A key the client did not send: fetched, as when its fetch failed."""


async def gather_resources(
    service: CdsService, body: HookRequest, caller: Caller, settings: ServiceSettings
) -> Gathered:
    """Every resource the service's prefetch templates ask for, prefetched or fetched."""
    gathered = Gathered()
    prefetch = body.prefetch or {}
    missing: dict[str, str] = {}
    pages: dict[str, str] = {}
    for key, template in service.prefetch.items():
        text = prefetch.get(key)
        where: Loc = ("body", "prefetch", key)
        value = _read(text, where) if text is not None else _MISSING
        if value is None:  # null: the client has no such data
            continue
        if text is None or value.resourceType == "OperationOutcome":
            missing[key] = _query(template, body, key)
            continue
        if value.resourceType == "Bundle":
            texts = ((i, bytes(e.resource)) for i, e in enumerate(value.entry or []))
            entries = [(i, text) for i, text in texts if text != b"null"]  # no resource
            gathered.add(entries, where, True)
            next_url = next_link(value.link or [])
            if next_url:
                pages[key] = next_url
        else:
            gathered.add([(0, text)], where, False)
    if missing or pages:
        await _fetch(gathered, missing, pages, body, caller, settings)
    return gathered


def _read(text: bytes, where: Loc) -> FhirValue | None:
    """A prefetch value's type and entries (None: `null`); 422 when it is no FHIR resource."""
    try:
        value = _VALUE.decode(text)
    except msgspec.ValidationError:
        data = msgspec.json.decode(text)
        if data is None:
            return None
        if isinstance(data, dict) and isinstance(data.get("resourceType"), str):
            message = "a Bundle's `entry` and `link` are lists of JSON objects"
            detail = field_error(where, message, "not_fhir")
            raise ApiError(422, "invalid_request", detail) from None
        value = FhirValue()
    if not isinstance(value.resourceType, str):
        raise ApiError(
            422,
            "invalid_request",
            field_error(where, "a prefetch value is a FHIR resource or null", "not_fhir"),
        )
    return value


async def _fetch(
    gathered: Gathered,
    missing: dict[str, str],
    pages: dict[str, str],
    body: HookRequest,
    caller: Caller,
    settings: ServiceSettings,
) -> None:
    """Fetch the missing keys and the further pages of prefetched searches (412 if it fails)."""
    source = _source(body, caller, settings, [*missing, *pages])
    limits = FetchLimits(
        timeout_s=settings.cds_fhir_timeout_s,
        max_answer_bytes=settings.cds_fhir_max_answer_bytes,
        max_call_bytes=settings.cds_fhir_max_call_bytes,
        max_resources=settings.cds_fhir_max_resources,
        page_size=PAGE_SIZE,
    )
    start = time.perf_counter()
    try:
        found = await fetch_all(source, missing, pages, limits)
    except FhirFetchError as exc:
        raise AuditedError(412, FHIR_UNAVAILABLE, FHIR_UNAVAILABLE_TEXT, str(exc)) from None
    finally:
        gathered.fetch_s = time.perf_counter() - start
    for key, resources in found.items():
        gathered.add(list(enumerate(resources)), ("fhirServer", key), True)


def _source(
    body: HookRequest, caller: Caller, settings: ServiceSettings, keys: list[str]
) -> FhirSource:
    """The FHIR server to fetch from, if the call gave one this service may use; else 412."""
    wanted = ", ".join(keys)
    if body.fhirServer is None or body.fhirAuthorization is None:
        raise ApiError(
            412,
            "prefetch_missing",
            f"prefetch {wanted} not sent and no fhirServer with fhirAuthorization to fetch it",
        )
    server = str(body.fhirServer)
    try:
        base = ServerBase.of(server)
    except ValueError as exc:
        detail = field_error(("body", "fhirServer"), str(exc), "fhir_server")
        raise ApiError(422, "invalid_request", detail) from None
    if base.plain_http_refused(settings.cds_allow_http_fhir):
        raise ApiError(
            412,
            "fhir_server_not_allowed",
            f"prefetch {wanted} must be fetched, but fhirServer is not https "
            "(MEDTPE_CDS_ALLOW_HTTP_FHIR)",
        )
    allowed = caller.config.fhir_servers
    url = httpx.URL(server)
    if allowed != ANY_FHIR_SERVER and not any(
        ServerBase.of(str(base)).holds(url) for base in allowed
    ):
        raise ApiError(
            412,
            "fhir_server_not_allowed",
            f"prefetch {wanted} must be fetched, but fhirServer is not one of this issuer's",
        )
    return FhirSource(server, body.fhirAuthorization.access_token)


def _query(template: str, body: HookRequest, key: str) -> str:
    """The template's query for this call (422 when the context lacks a token's field)."""
    try:
        return render_template(template, body.context, url_encoded=True)
    except TemplateError as exc:
        field = exc.token.removeprefix("context.")
        raise ApiError(
            422, "invalid_request", field_error(("body", "context", field), str(exc), "missing")
        ) from None
