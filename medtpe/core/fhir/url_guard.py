"""Where a FHIR server's access token may go: the one rule of both FHIR clients, the Bulk Data
export and the write-back (`medtpe.batch.fhir_http`, `medtpe.batch.bulk_client`,
`medtpe.batch.write_back`) and a CDS hook's fetch of the prefetch it left out
(`medtpe.service.cds_hooks.fhir_fetch`). Pure Python: it decides on a URL's parts (`Url`) and
the client's settings, and each client hands it the parts as its own HTTP client parses them.

The rule, the same for both:

- Only absolute `http` and `https` URLs with a host are requested; a URL's origin is its scheme,
  lower-cased host and port (the scheme's default port filled in).
- Transport (`transport_refusal`): HTTPS; plain HTTP only as the client's `PlainHttp` says.
- The token goes to the FHIR server's own origin only (`TokenScope`): the same scheme, host and
  port, and never to a URL with user info (where URL parsers disagree about the host).
- A redirect is a new URL, checked by the same rules before it is requested: the HTTP clients
  follow none by themselves, each client follows them by hand.

Where the clients differ on purpose (each takes the stricter rule its input calls for):

- Plain HTTP. Batch: to the loopback only (`PlainHttp.LOOPBACK`: a test server, a sidecar); its
  URLs are the operator's (the command line, the server's own manifest checked against them).
  Hook: never (`PlainHttp.NEVER`), any host when the operator allows it for closed networks
  (`PlainHttp.ANY`, MEDTPE_CDS_ALLOW_HTTP_FHIR), the loopback not exempt: the URL is the
  caller's, and the loopback is the service's own host, a server-side request forgery target.
- The token's scope. Batch: the whole origin (`TokenScope.on_origin`): Bulk Data status URLs and
  output files lie on the server's origin, not always under its base path. Hook: the base URL's
  path, whole segments, no dot segment, percent-encoded or not (`TokenScope.under_base`): every
  fetch is a FHIR query under the base, and a server decoding `%2E%2E` must not be walked out of
  it.
- Off the scope. Batch: an output file that needs no token (`requiresAccessToken: false`), and a
  redirect of a download to a file server, are fetched without the token (over HTTPS); a
  kick-off, status or write-back URL off the origin is refused. Hook: nothing off the scope is
  requested at all, token or not: no link or redirect leaves the server.
- The parser. Batch: `urllib.parse` (`Url.split`); hook: httpx's parse, the parser that sends the
  request, so that what is checked is what is fetched.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import unquote, urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
"""The schemes requested and their default ports."""
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
"""The hosts `PlainHttp.LOOPBACK` reaches over plain HTTP."""
DOT_SEGMENTS = frozenset({".", ".."})

Origin = tuple[str, str, int]
"""(scheme, lower-cased host, port with the default filled in)."""


class PlainHttp(StrEnum):
    """Where a client may send the token over plain HTTP."""

    NEVER = "never"
    LOOPBACK = "loopback"
    ANY = "any"


class Refusal(StrEnum):
    """Why a URL is refused (each client says it in its own error)."""

    NOT_HTTP = "not an absolute http(s) URL"
    PLAIN_HTTP = "plain HTTP where HTTPS is required"
    USER_INFO = "user info in the URL"
    OTHER_ORIGIN = "another origin (scheme, host or port)"
    OUTSIDE_BASE = "a path outside the FHIR server's base path"
    DOT_SEGMENT = "a dot segment in the path"
    BASE_WITH_QUERY = "a query or fragment in a FHIR base URL"


@dataclass(frozen=True)
class Url:
    """A URL's parts as the client that requests it parsed them."""

    scheme: str
    host: str
    port: int | None
    """The port written in the URL (None: the scheme's default)."""
    path: str
    """The path as written (percent-encoding kept), without the query."""
    userinfo: str = ""
    query: str = ""
    fragment: str = ""

    @classmethod
    def split(cls, url: str) -> Url:
        """`url`'s parts by `urllib.parse` (`ValueError` for a port that is no port number)."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        return cls(
            parts.scheme,
            parts.hostname or "",
            parts.port,
            parts.path,
            userinfo,
            parts.query,
            parts.fragment,
        )

    def is_http(self) -> bool:
        """Whether it is an absolute http(s) URL with a host."""
        return self.scheme in DEFAULT_PORTS and bool(self.host)

    def origin(self) -> Origin:
        """(scheme, lower-cased host, port); `ValueError` unless `is_http`."""
        if not self.is_http():
            raise ValueError(Refusal.NOT_HTTP.value)
        port = self.port if self.port is not None else DEFAULT_PORTS[self.scheme]
        return self.scheme, self.host.lower(), port

    def has_dot_segment(self) -> bool:
        """Whether its path has a `.` or `..` segment, percent-encoded or not (a server may
        decode `%2E%2E`)."""
        return any(unquote(segment) in DOT_SEGMENTS for segment in self.path.split("/"))


def transport_refusal(url: Url, plain_http: PlainHttp) -> Refusal | None:
    """Why the token may not travel to `url` (not http(s), or plain HTTP where `plain_http`
    refuses it); None when it may."""
    if not url.is_http():
        return Refusal.NOT_HTTP
    if url.scheme == "https" or plain_http is PlainHttp.ANY:
        return None
    if plain_http is PlainHttp.LOOPBACK and url.host.lower() in LOOPBACK_HOSTS:
        return None
    return Refusal.PLAIN_HTTP


@dataclass(frozen=True)
class TokenScope:
    """Where one FHIR server's access token may go: its origin, and under `path` when given."""

    origin: Origin
    path: str | None = None
    """The base URL's path without its trailing slash (None: anywhere on the origin)."""

    @classmethod
    def on_origin(cls, base: Url) -> TokenScope:
        """Anywhere on `base`'s origin (`ValueError` when it is no http(s) URL)."""
        return cls(base.origin())

    @classmethod
    def under_base(cls, base: Url) -> TokenScope:
        """Under `base`'s path, on its origin; `ValueError` (a `Refusal`'s text) when it is no
        http(s) URL or holds user info, a query, a fragment or a dot segment."""
        origin = base.origin()
        if base.userinfo:
            raise ValueError(Refusal.USER_INFO.value)
        if base.query or base.fragment:
            raise ValueError(Refusal.BASE_WITH_QUERY.value)
        if base.has_dot_segment():
            raise ValueError(Refusal.DOT_SEGMENT.value)
        return cls(origin, base.path.rstrip("/"))

    def refusal(self, url: Url) -> Refusal | None:
        """Why the token may not go to `url`; None when it may."""
        if not url.is_http():
            return Refusal.NOT_HTTP
        if url.userinfo:
            return Refusal.USER_INFO
        if url.origin() != self.origin:
            return Refusal.OTHER_ORIGIN
        if self.path is None:
            return None
        if not (url.path == self.path or url.path.startswith(self.path + "/")):
            return Refusal.OUTSIDE_BASE
        return Refusal.DOT_SEGMENT if url.has_dot_segment() else None

    def admits(self, url: Url) -> bool:
        """Whether the token may go to `url`."""
        return self.refusal(url) is None
