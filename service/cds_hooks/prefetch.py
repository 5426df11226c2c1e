"""A hook call's FHIR resources: what the CDS client prefetched, and what it left out fetched
from its FHIR server (CDS Hooks 2.0.1, "Providing FHIR Resources to a CDS Service").

Per prefetch key of the service: a value (a resource, or a Bundle whose further pages are
fetched) is used as sent; `null` means the client has no such data; a missing key, or an
OperationOutcome in its place (the client's fetch failed), is fetched with the call's
`fhirServer` and `fhirAuthorization`. Without those, or when the server cannot answer, the call
is refused with 412 Precondition Failed, as the specification requires; a prefetched value that
is no FHIR resource is a 422 naming its key.

The resources are gathered as JSON text: a prefetched Bundle's entries are cut out of the text
the client sent without decoding them (msgspec), fetched ones are encoded once.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

import msgspec

from medtpe_core.cds.services import CdsService, TemplateError, render_template
from service.cds_hooks.fhir_fetch import FhirFetchError, FhirSource, fetch_all, next_pages
from service.cds_hooks.jwt_auth import Caller
from service.cds_hooks.schemas import HookRequest
from service.errors import ApiError, field_error
from service.settings import ServiceSettings

PAGE_SIZE = 500
"""`_count` of the searches the service runs itself."""
MAX_RESOURCES = 200_000
"""Most resources one prefetch key may bring (MEDS: at most 200,000 events per record)."""

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


class _Entry(msgspec.Struct):
    resource: msgspec.Raw = msgspec.Raw(b"null")


class _Link(msgspec.Struct):
    relation: object = None
    url: object = None


class _Value(msgspec.Struct):
    """What is read of a prefetch value: its type, and a Bundle's entries and links."""

    resourceType: object = None
    entry: list[_Entry] | None = None
    link: list[_Link] | None = None


_VALUE = msgspec.json.Decoder(_Value)
_MISSING = _Value(resourceType="OperationOutcome")
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
            next_url = _next_link(value.link or [])
            if next_url:
                pages[key] = next_url
        else:
            gathered.add([(0, text)], where, False)
    if missing or pages:
        await _fetch(gathered, missing, pages, body, caller, settings)
    return gathered


def _read(text: bytes, where: Loc) -> _Value | None:
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
        value = _Value()
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
    start = time.perf_counter()
    try:
        found = await fetch_all(
            source,
            missing,
            timeout_s=settings.cds_fhir_timeout_s,
            page_size=PAGE_SIZE,
            max_resources=MAX_RESOURCES,
        )
        for key, next_url in pages.items():
            found[key] = await next_pages(
                source,
                key,
                next_url,
                timeout_s=settings.cds_fhir_timeout_s,
                max_resources=MAX_RESOURCES,
            )
    except FhirFetchError as exc:
        raise ApiError(412, f"fhir_{exc.reason}", str(exc)) from None
    finally:
        gathered.fetch_s = time.perf_counter() - start
    for key, resources in found.items():
        texts = [(i, msgspec.json.encode(resource)) for i, resource in enumerate(resources)]
        gathered.add(texts, ("fhirServer", key), True)


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
    if body.fhirServer.scheme != "https" and not settings.cds_allow_http_fhir:
        raise ApiError(
            412,
            "fhir_server_not_allowed",
            f"prefetch {wanted} must be fetched, but fhirServer is not https "
            "(MEDTPE_CDS_ALLOW_HTTP_FHIR)",
        )
    allowed = [str(url).rstrip("/") for url in caller.config.fhir_servers]
    base = server.rstrip("/")
    if allowed and not any(base == url or base.startswith(url + "/") for url in allowed):
        raise ApiError(
            412,
            "fhir_server_not_allowed",
            f"prefetch {wanted} must be fetched, but fhirServer is not one of this issuer's",
        )
    return FhirSource(server, body.fhirAuthorization.access_token)


def _query(template: str, body: HookRequest, key: str) -> str:
    """The template's query for this call (422 when the context lacks a token's field)."""
    try:
        return render_template(template, body.context)
    except TemplateError as exc:
        field = exc.token.removeprefix("context.")
        raise ApiError(
            422, "invalid_request", field_error(("body", "context", field), str(exc), "missing")
        ) from None


def _next_link(links: list[_Link]) -> str | None:
    for link in links:
        if link.relation == "next" and isinstance(link.url, str) and link.url:
            return link.url
    return None
