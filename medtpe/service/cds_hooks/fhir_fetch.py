"""Fetching prefetch queries from the CDS client's FHIR server: a small client of our own on
httpx streaming, kept to OWASP's rules against server-side request forgery.

- Every URL requested (a query's first page, each `next` link, each redirect) is parsed by the
  parser that sends it (httpx) and must lie on the call's `fhirServer` (`ServerBase`, the token
  scope under a base URL of `medtpe.core.fhir.url_guard`, the rule both FHIR clients share): the
  same scheme, host and port (lower-cased, default ports filled in), a path under the server's
  path with no dot segment (percent-encoded or not), no user info. Only such URLs are requested,
  so the access token goes to that server only.
- Redirects are followed by hand, at most `MAX_REDIRECTS` hops, each checked the same way; one
  leaving the server is not followed.
- Answers are read as a stream and counted as the bytes arrive: one answer over
  `max_answer_bytes`, or a call's answers together over `max_call_bytes`, stops the reading and
  closes the connection; a call's resources over `max_resources` stop the paging; one deadline
  covers all of a call's fetches. Compressed answers are refused (`Accept-Encoding: identity` is
  asked): a compressed answer's size is known only after inflating it.
- An answer must be UTF-8 JSON of the expected shape: a search's a Bundle whose `entry` is a list
  of objects, each with a resource (an object with a string `resourceType`) or without, and whose
  `link` is a list of objects; a read's a resource of the type read. Resources are kept as the
  JSON text the server sent.

Every failure is a `FhirFetchError` saying what happened and for which prefetch key, for the
audit log only: never the server's answer (it may hold patient data), never the access token.
httpx's own request log (each URL at INFO: a query's URL holds the patient's id) is kept to
warnings.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import parse_qsl

import httpx
import msgspec

from medtpe.core.fhir.url_guard import PlainHttp, TokenScope, Url, transport_refusal

MAX_REDIRECTS = 3
"""Redirects followed for one request (each one on the FHIR server)."""
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
PAGE_SIZE_PARAM = "_count"
REFUSED_STATUSES = frozenset({401, 403})

T = TypeVar("T")

logging.getLogger("httpx").setLevel(logging.WARNING)


class FhirFetchError(Exception):
    """A prefetch query could not be answered; the message says what happened (for the audit
    log: no server answer, no token, no URL)."""

    def __init__(self, key: str, what: str) -> None:
        super().__init__(f"prefetch {key}: {what}")
        self.key = key


def url_parts(url: httpx.URL) -> Url:
    """`url`'s parts as httpx, which sends the request, parsed them."""
    return Url(
        url.scheme,
        url.host,
        url.port,
        url.raw_path.partition(b"?")[0].decode("ascii"),
        url.userinfo.decode("ascii"),
        url.query.decode("ascii"),
        url.fragment,
    )


@dataclass(frozen=True)
class ServerBase:
    """A FHIR server's base URL as URLs are compared with it: its parts and the token's scope
    under it (`medtpe.core.fhir.url_guard.TokenScope.under_base`)."""

    url: Url
    scope: TokenScope

    @classmethod
    def of(cls, url: str) -> ServerBase:
        """The base of `url` (httpx's parse: lower-cased scheme and host, no dot segments);
        `ValueError` when it is no http(s) URL or holds user info, a query, a fragment or a dot
        segment."""
        try:
            parsed = url_parts(httpx.URL(url))
        except httpx.InvalidURL as exc:
            raise ValueError(f"not a URL: {exc}") from None
        return cls(parsed, TokenScope.under_base(parsed))

    def holds(self, url: httpx.URL) -> bool:
        """Whether `url` lies on this server: same scheme, host and port, its path this path or
        under it (whole segments), no dot segment, no user info."""
        return self.scope.admits(url_parts(url))

    def plain_http_refused(self, allow_http: bool) -> bool:
        """Whether the base is plain HTTP and plain HTTP is not allowed (`allow_http`: to any
        host; never only to the loopback, the service's own host)."""
        plain_http = PlainHttp.ANY if allow_http else PlainHttp.NEVER
        return transport_refusal(self.url, plain_http) is not None


@dataclass(frozen=True)
class FhirSource:
    """The CDS client's FHIR server and the bearer token it gave for it."""

    base_url: str
    access_token: str = field(repr=False)


@dataclass(frozen=True)
class FetchLimits:
    """What one call's fetches may take: time, bytes per answer and in all, resources, and the
    page size asked of searches."""

    timeout_s: float
    max_answer_bytes: int
    max_call_bytes: int
    max_resources: int
    page_size: int


class Entry(msgspec.Struct):
    """A Bundle entry as read: its resource's JSON text (`null`: none)."""

    resource: msgspec.Raw = msgspec.Raw(b"null")


class Link(msgspec.Struct):
    """A Bundle link as read."""

    relation: object = None
    url: object = None


class FhirValue(msgspec.Struct):
    """What is read of a FHIR value: its type, and a Bundle's entries and links."""

    resourceType: object = None
    entry: list[Entry] | None = None
    link: list[Link] | None = None


class _Typed(msgspec.Struct):
    resourceType: str


_VALUE = msgspec.json.Decoder(FhirValue)
_TYPED = msgspec.json.Decoder(_Typed)
NO_RESOURCE = b"null"


def next_link(links: list[Link]) -> str | None:
    """The URL of a Bundle's `next` link, if it has one."""
    for link in links:
        if link.relation == "next" and isinstance(link.url, str) and link.url:
            return link.url
    return None


async def fetch_all(
    source: FhirSource,
    queries: Mapping[str, str],
    pages: Mapping[str, str],
    limits: FetchLimits,
) -> dict[str, list[bytes]]:
    """Each key's resources as JSON text: every match of its query (`queries`: relative FHIR
    URLs, `Patient/12`, `Observation?patient=12`), or the resources of a prefetched search's
    further pages from its `next` link on (`pages`), fetched concurrently within `limits`."""
    base = ServerBase.of(source.base_url)
    headers = {
        "Authorization": f"Bearer {source.access_token}",
        "Accept": "application/fhir+json",
        "Accept-Encoding": "identity",
    }
    timeout = httpx.Timeout(limits.timeout_s)
    async with httpx.AsyncClient(headers=headers, timeout=timeout) as client:
        fetcher = _Fetcher(client, base, source.base_url.rstrip("/"), limits)
        jobs = {key: fetcher.query(key, query) for key, query in queries.items()}
        jobs |= {key: fetcher.further_pages(key, url) for key, url in pages.items()}
        try:
            async with asyncio.timeout(limits.timeout_s):
                return await _together(jobs)
        except TimeoutError:
            keys = ", ".join(jobs)
            raise FhirFetchError(keys, f"no answer within {limits.timeout_s:g} s") from None


async def _together(jobs: Mapping[str, Coroutine[None, None, T]]) -> dict[str, T]:
    """Each job's result by key; the first `FhirFetchError` cancels the others and is raised."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = {key: group.create_task(job) for key, job in jobs.items()}
    except ExceptionGroup as failed:  # not `except*`: Python 3.11.2 re-wraps what it raises
        first = next((e for e in failed.exceptions if isinstance(e, FhirFetchError)), None)
        if first is None:
            raise
        raise first from None
    return {key: task.result() for key, task in tasks.items()}


@dataclass
class _Fetcher:
    """One call's fetches: its client, the server they stay on, and what they have taken."""

    client: httpx.AsyncClient
    base: ServerBase
    base_url: str
    limits: FetchLimits
    read_bytes: int = 0
    resources: int = 0

    async def query(self, key: str, query: str) -> list[bytes]:
        """One query's resources: a read (`Type/id`) its resource, a search every match."""
        path, _, params = query.partition("?")
        if not params and path.count("/") == 1:
            text = await self.get(key, self.link(key, None, f"{self.base_url}/{path}"))
            self.count(key, 1)
            return [_resource(key, text, path.partition("/")[0])]
        if PAGE_SIZE_PARAM not in {name for name, _ in parse_qsl(params)}:
            query += f"{'&' if params else '?'}{PAGE_SIZE_PARAM}={self.limits.page_size}"
        return await self.pages(key, self.link(key, None, f"{self.base_url}/{query}"))

    async def further_pages(self, key: str, next_url: str) -> list[bytes]:
        """The resources of a prefetched search's further pages, from its `next` link on."""
        return await self.pages(key, self.link(key, None, next_url))

    async def pages(self, key: str, url: httpx.URL) -> list[bytes]:
        """Every resource of a search's pages, from `url` on through the `next` links."""
        found: list[bytes] = []
        seen: set[httpx.URL] = set()
        next_url: httpx.URL | None = url
        while next_url is not None:
            if next_url in seen:
                raise FhirFetchError(key, "the next links go round in a loop")
            seen.add(next_url)
            resources, link = _page(key, await self.get(key, next_url))
            self.count(key, len(resources))
            found += resources
            next_url = self.link(key, next_url, link) if link is not None else None
        return found

    def link(self, key: str, page: httpx.URL | None, target: str) -> httpx.URL:
        """`target` (resolved against the `page` it came from) if it is on the server."""
        try:
            url = page.join(target) if page is not None else httpx.URL(target)
        except httpx.InvalidURL:
            raise FhirFetchError(key, "a link or redirect that is no URL") from None
        if not self.base.holds(url):
            raise FhirFetchError(key, "a link or redirect leaving fhirServer (not followed)")
        return url

    async def get(self, key: str, url: httpx.URL) -> bytes:
        """The answer at `url` (redirects on the server followed), read within the limits."""
        for _ in range(MAX_REDIRECTS + 1):
            try:
                async with self.client.stream("GET", url) as answer:
                    location = answer.headers.get("location")
                    if answer.status_code in REDIRECT_STATUSES and location:
                        url = self.link(key, url, location)
                        continue
                    if answer.status_code in REFUSED_STATUSES:
                        raise FhirFetchError(key, f"status {answer.status_code}: token refused")
                    if answer.status_code != httpx.codes.OK:
                        raise FhirFetchError(key, f"status {answer.status_code}")
                    return await self.read(key, answer)
            except httpx.HTTPError as exc:
                raise FhirFetchError(key, f"no answer ({type(exc).__name__})") from None
        raise FhirFetchError(key, f"more than {MAX_REDIRECTS} redirects")

    async def read(self, key: str, answer: httpx.Response) -> bytes:
        """The answer's body, counted chunk by chunk against the byte limits."""
        encoding = answer.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise FhirFetchError(key, "a compressed answer (identity asked)")
        chunks: list[bytes] = []
        size = 0
        async for chunk in answer.aiter_raw():
            size += len(chunk)
            self.read_bytes += len(chunk)
            if size > self.limits.max_answer_bytes:
                raise FhirFetchError(key, f"an answer over {self.limits.max_answer_bytes:,} bytes")
            if self.read_bytes > self.limits.max_call_bytes:
                raise FhirFetchError(key, f"answers over {self.limits.max_call_bytes:,} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def count(self, key: str, n: int) -> None:
        """Count `n` more resources of the call (over `max_resources`: the fetch fails)."""
        self.resources += n
        if self.resources > self.limits.max_resources:
            raise FhirFetchError(key, f"more than {self.limits.max_resources:,} resources")


def _decoded(key: str, text: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    """`text` decoded by `decoder`; UTF-8 JSON of its shape, else `FhirFetchError`."""
    try:
        text.decode("utf-8")
        return decoder.decode(text)
    except msgspec.ValidationError as exc:
        raise FhirFetchError(key, f"an answer of the wrong shape ({exc})") from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise FhirFetchError(key, f"an answer that is no JSON ({type(exc).__name__})") from None


def _page(key: str, text: bytes) -> tuple[list[bytes], str | None]:
    """A search page's resources (JSON text) and its `next` link."""
    value = _decoded(key, text, _VALUE)
    if value.resourceType != "Bundle":
        raise FhirFetchError(key, "a search answered without a Bundle")
    resources = [bytes(entry.resource) for entry in value.entry or []]
    resources = [resource for resource in resources if resource != NO_RESOURCE]
    for resource in resources:
        _decoded(key, resource, _TYPED)
    return resources, next_link(value.link or [])


def _resource(key: str, text: bytes, kind: str) -> bytes:
    """A read's resource (JSON text), checked to be of the type read."""
    if _decoded(key, text, _TYPED).resourceType != kind:
        raise FhirFetchError(key, f"a read of {kind} answered with another resource type")
    return text
