"""A hook call's FHIR resources: what the CDS client prefetched, and what it left out fetched
from its FHIR server (CDS Hooks 2.0.1, "Providing FHIR Resources to a CDS Service").

Per prefetch key of the service: a value (a resource, or a Bundle whose further pages are
fetched) is used as sent; `null` means the client has no such data; a missing key, or an
OperationOutcome in its place (the client's fetch failed), is fetched with the call's
`fhirServer` and `fhirAuthorization`. Without those, or when the server cannot answer, the call
is refused with 412 Precondition Failed, as the specification requires; a prefetched value that
is no FHIR resource is a 422 naming its key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

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
    """The call's resources in order, where each came from (its location for error messages),
    and the time spent fetching."""

    resources: list[dict[str, Any]] = field(default_factory=list)
    origins: list[Loc] = field(default_factory=list)
    fetch_s: float = 0.0

    def add(self, resources: list[dict[str, Any]], where: Loc, in_bundle: bool) -> None:
        """Append `resources`, located under `where` (as Bundle entries when `in_bundle`)."""
        for i, resource in enumerate(resources):
            self.resources.append(resource)
            self.origins.append((*where, "entry", i, "resource") if in_bundle else where)


async def gather_resources(
    service: CdsService, body: HookRequest, caller: Caller, settings: ServiceSettings
) -> Gathered:
    """Every resource the service's prefetch templates ask for, prefetched or fetched."""
    gathered = Gathered()
    prefetch = body.prefetch or {}
    missing: dict[str, str] = {}
    pages: dict[str, str] = {}
    for key, template in service.prefetch.items():
        value = prefetch.get(key, _MISSING)
        if value is None:
            continue
        where: Loc = ("body", "prefetch", key)
        if value is _MISSING or _is_outcome(value):
            missing[key] = _query(template, body, key)
            continue
        if not isinstance(value, dict) or not isinstance(value.get("resourceType"), str):
            raise ApiError(
                422,
                "invalid_request",
                field_error(where, "a prefetch value is a FHIR resource or null", "not_fhir"),
            )
        if value["resourceType"] == "Bundle":
            entries = value.get("entry") or []
            gathered.add([e["resource"] for e in entries if isinstance(e, dict)], where, True)
            next_url = _next_link(value)
            if next_url:
                pages[key] = next_url
        else:
            gathered.add([value], where, False)
    if missing or pages:
        await _fetch(gathered, missing, pages, body, caller, settings)
    return gathered


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
        gathered.add(resources, ("fhirServer", key), True)


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


class _Missing:
    """A prefetch key the client did not send."""


_MISSING = _Missing()


def _is_outcome(value: object) -> bool:
    """An OperationOutcome where a prefetch value should be: the client's fetch failed."""
    return isinstance(value, dict) and value.get("resourceType") == "OperationOutcome"


def _next_link(bundle: dict[str, Any]) -> str | None:
    for link in bundle.get("link") or []:
        if isinstance(link, dict) and link.get("relation") == "next" and link.get("url"):
            return str(link["url"])
    return None
