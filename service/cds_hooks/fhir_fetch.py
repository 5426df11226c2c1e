"""Fetching prefetch queries from the CDS client's FHIR server (async, fhirpy on aiohttp).

Used when a hook call leaves a prefetch key out, or prefetched a search whose Bundle has further
pages. Each query is a relative FHIR URL (`Patient/12`, `Observation?patient=12`); searches are
paged through their `next` links (fhirpy refuses a link off the server's base URL). Every failure
— an error status, a refused token, an unreachable server, a timeout, a link off the server, more
resources than allowed — is a `FhirFetchError` naming the prefetch key, never the server's answer
(it may hold patient data) and never the access token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
from fhirpy import AsyncFHIRClient
from fhirpy.base.exceptions import (
    AuthorizationError,
    BaseFHIRError,
    ForbiddenError,
    ResourceNotFound,
)
from fhirpy.base.utils import get_by_path, parse_pagination_url

Resource = dict[str, Any]


class FhirFetchError(Exception):
    """A prefetch query could not be answered; `reason` is a short code, the message says what
    happened in words (no server answer, no token)."""

    def __init__(self, key: str, reason: str, message: str) -> None:
        super().__init__(f"prefetch {key!r}: {message}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class FhirSource:
    """The CDS client's FHIR server and the bearer token it gave for it."""

    base_url: str
    access_token: str

    def client(self, timeout_s: float) -> AsyncFHIRClient:
        """An async client on the server, each request bounded by `timeout_s`."""
        return AsyncFHIRClient(
            self.base_url.rstrip("/"),
            authorization=f"Bearer {self.access_token}",
            aiohttp_config={"timeout": aiohttp.ClientTimeout(total=timeout_s)},
        )


async def fetch_all(
    source: FhirSource,
    queries: Mapping[str, str],
    *,
    timeout_s: float,
    page_size: int,
    max_resources: int,
) -> dict[str, list[Resource]]:
    """Each query's resources, fetched concurrently within `timeout_s` in all."""
    client = source.client(timeout_s)
    try:
        async with asyncio.timeout(timeout_s):
            found = await asyncio.gather(
                *(
                    _fetch(client, key, query, page_size, max_resources)
                    for key, query in queries.items()
                )
            )
    except TimeoutError:
        keys = ", ".join(queries)
        raise FhirFetchError(
            keys, "timeout", f"the FHIR server did not answer within {timeout_s:g} s"
        ) from None
    return dict(zip(queries, found, strict=True))


async def next_pages(
    source: FhirSource,
    key: str,
    next_url: str,
    *,
    timeout_s: float,
    max_resources: int,
) -> list[Resource]:
    """The resources of a paged search's remaining pages, from its `next` link on."""
    client = source.client(timeout_s)
    try:
        async with asyncio.timeout(timeout_s):
            return await _guarded(key, _pages(client, key, next_url, None, max_resources))
    except TimeoutError:
        raise FhirFetchError(
            key, "timeout", f"the FHIR server did not answer within {timeout_s:g} s"
        ) from None


async def _fetch(
    client: AsyncFHIRClient, key: str, query: str, page_size: int, max_resources: int
) -> list[Resource]:
    """One query: a read (`Type/id`) gives its resource, a search (`Type?...`) every match."""
    parts = urlsplit(query)
    path = parts.path.strip("/")
    if "?" not in query and path.count("/") == 1:
        resource = await _guarded(key, client.execute(path, method="get"))
        return [dict(resource)] if resource else []
    query_params = parse_qs(parts.query)
    params: dict[str, Any] = {k: v if len(v) > 1 else v[0] for k, v in query_params.items()}
    params.setdefault("_count", str(page_size))
    return await _guarded(key, _pages(client, key, path, params, max_resources))


async def _pages(
    client: AsyncFHIRClient,
    key: str,
    path: str,
    params: dict[str, Any] | None,
    max_resources: int,
) -> list[Resource]:
    """Every entry's resource of a search and its following pages."""
    found: list[Resource] = []
    request: tuple[str, Any] = (path, params)
    while True:
        bundle = await client.execute(request[0], method="get", params=request[1])
        if not isinstance(bundle, dict) or bundle.get("resourceType") != "Bundle":
            raise FhirFetchError(key, "not_a_bundle", "a search answered without a Bundle")
        entries = bundle.get("entry") or []
        found += [dict(entry["resource"]) for entry in entries if "resource" in entry]
        if len(found) > max_resources:
            raise FhirFetchError(key, "too_many", f"more than {max_resources:,} resources")
        next_url = get_by_path(bundle, ["link", {"relation": "next"}, "url"])
        if not next_url:
            return found
        request = parse_pagination_url(next_url)


async def _guarded(key: str, call: Any) -> Any:
    """Await `call`, each FHIR client failure as a `FhirFetchError`."""
    try:
        return await call
    except (AuthorizationError, ForbiddenError):
        raise FhirFetchError(key, "refused", "the FHIR server refused the access token") from None
    except ResourceNotFound:
        raise FhirFetchError(key, "not_found", "the FHIR server has no such resource") from None
    except BaseFHIRError:
        raise FhirFetchError(key, "server_error", "the FHIR server answered an error") from None
    except ValueError:  # fhirpy: a paging link off the server's base URL
        raise FhirFetchError(key, "bad_link", "a paging link leaves the FHIR server") from None
    except aiohttp.ClientError as exc:
        raise FhirFetchError(
            key, "unreachable", f"the FHIR server could not be reached ({type(exc).__name__})"
        ) from None
