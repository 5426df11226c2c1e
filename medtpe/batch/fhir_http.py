"""HTTP with a FHIR server for the Bulk Data client and SMART Backend Services: where the access
token may go (`medtpe.core.fhir.url_guard`'s rule, on URLs parsed by `urllib.parse`: HTTPS,
plain HTTP to the loopback only, the token anywhere on the FHIR server's origin), waits the
server asks for (`Retry-After`), responses read under a size cap (and, where the caller asks,
within a total deadline), JSON parsed only when it nests no deeper than `MAX_JSON_DEPTH` (checked on
the bytes: no `RecursionError`), and the server's errors (an OperationOutcome, an OAuth error) as
one clear message, its text stripped of control characters and cut to `MAX_SERVER_TEXT` characters
(`server_text`: it is printed and logged). Network errors are summarised without the server's text
of them."""

from __future__ import annotations

import email.utils
import json
import threading
import time
import unicodedata
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urljoin

import httpx

from medtpe.batch.ndjson_lines import MAX_JSON_DEPTH, nested_deeper_than
from medtpe.core.fhir.url_guard import PlainHttp, Refusal, TokenScope, Url, transport_refusal

MAX_JSON_BYTES = 16 * 1024 * 1024
"""The largest JSON document read (configuration, token, status, manifest)."""
MAX_HEADER_DIGITS = 9
"""The most digits of a numeric header read (`Retry-After` seconds; more waits the default)."""
MAX_HTTP_DATE_CHARS = 64
"""The longest `Retry-After` read as an HTTP date (longer: the default wait)."""
RETRIED_STATUSES = frozenset({429, 503})
"""Statuses retried after the server's `Retry-After`."""
MAX_SERVER_TEXT = 500
"""The most characters of a server's own text (an error's explanation) put in a message."""


class FhirServerError(RuntimeError):
    """A FHIR server or its authorisation server refused or failed a request: the message names
    the request, the status and the server's own explanation."""


@dataclass(frozen=True)
class HttpSettings:
    """Caps on times and retries."""

    connect_s: float = 10.0
    read_s: float = 120.0
    """Longest silence while reading a response."""
    retries: int = 5
    """Attempts after a 429 / 503 (or a transient OperationOutcome) before giving up."""
    default_wait_s: float = 5.0
    """Wait when the server gives no `Retry-After`."""
    max_wait_s: float = 300.0
    """The longest wait honoured (a longer `Retry-After` is shortened to it)."""

    def client(self) -> httpx.Client:
        """An HTTP client with these timeouts that follows no redirect."""
        timeout = httpx.Timeout(self.read_s, connect=self.connect_s)
        return httpx.Client(timeout=timeout, follow_redirects=False)


def check_secure(url: str, what: str) -> None:
    """Refuse plain HTTP to any host but the loopback (tokens and keys never travel in clear):
    `FhirServerError`; `ValueError` for a URL that is no absolute http(s) URL."""
    refusal = transport_refusal(Url.split(url), PlainHttp.LOOPBACK)
    if refusal is Refusal.NOT_HTTP:
        raise ValueError(f"{url!r} is no absolute http(s) URL")
    if refusal is not None:
        raise FhirServerError(f"{what} {url} is not HTTPS")


def token_scope(base: str) -> TokenScope:
    """Where the FHIR server's access token may go: anywhere on the origin of its base URL
    `base` (Bulk Data status URLs and files lie on it, not always under the base path)."""
    return TokenScope.on_origin(Url.split(base))


def token_may_go(scope: TokenScope, url: str) -> bool:
    """Whether the token of `scope` may be sent to `url` (`ValueError` for a port that is no
    port number)."""
    return scope.admits(Url.split(url))


def resolve(base: str, reference: str) -> str:
    """A URL the server gave (`Content-Location`, a redirect) made absolute against `base`."""
    return urljoin(base, reference)


def retry_after_s(headers: httpx.Headers, settings: HttpSettings) -> float:
    """The wait a response asks for (`Retry-After` seconds or HTTP date), within the caps; any
    other value (`²`, a number of 5,000 digits, a bad date) waits the default."""
    value = headers.get("Retry-After")
    wait = settings.default_wait_s
    if value:
        value = value.strip()
        if is_ascii_number(value, MAX_HEADER_DIGITS):
            wait = float(value)
        elif len(value) <= MAX_HTTP_DATE_CHARS:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                if when.tzinfo is None:
                    when = when.replace(tzinfo=UTC)
                wait = (when - datetime.now(UTC)).total_seconds()
    return min(max(wait, 0.0), settings.max_wait_s)


def is_ascii_number(text: str, max_digits: int) -> bool:
    """Whether `text` is 1 to `max_digits` ASCII digits (`str.isdigit` also accepts `²` and other
    digits `int()` refuses)."""
    return 0 < len(text) <= max_digits and text.isascii() and text.isdigit()


def server_text(text: str, limit: int = MAX_SERVER_TEXT) -> str:
    """A server's `text` fit to print and log: control and format characters (terminal escapes,
    line breaks, bidirectional overrides) made spaces, runs of spaces one, at most `limit`
    characters (then `…`)."""
    shown = " ".join(
        "".join(" " if unicodedata.category(c).startswith("C") else c for c in text).split()
    )
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def read_capped(
    response: httpx.Response, limit: int, abandoned: threading.Event | None = None
) -> bytes:
    """The body of a streamed response, refused beyond `limit` bytes (and given up as soon as
    `abandoned` is set: `FhirServerError`)."""
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > limit:
            raise FhirServerError(f"{response.request.url}: a response over {limit} bytes")
        if abandoned is not None and abandoned.is_set():
            raise FhirServerError(f"{response.request.url}: the response was given up")
    return bytes(body)


@dataclass(frozen=True)
class Reply:
    """A response read whole (under the size cap)."""

    status: int
    headers: httpx.Headers
    url: str
    content: bytes
    reason: str

    def json(self) -> Any:
        """The body as JSON (`FhirServerError` when it is not, or nests deeper than
        `MAX_JSON_DEPTH`)."""
        if nested_deeper_than(self.content, MAX_JSON_DEPTH):
            raise FhirServerError(
                f"{self.url}: the response nests deeper than {MAX_JSON_DEPTH} levels"
            )
        try:
            return json.loads(self.content)
        except ValueError as exc:
            raise FhirServerError(f"{self.url}: the response is not JSON") from exc

    def _body(self) -> Any:
        """The body as JSON, or None where `json` refuses it."""
        try:
            return self.json()
        except FhirServerError:
            return None

    def explanation(self) -> str:
        """What the server says of an error: an OperationOutcome's issues, an OAuth error, else
        the status text; as `server_text` (no control character, at most `MAX_SERVER_TEXT`)."""
        body = self._body()
        if isinstance(body, dict) and body.get("resourceType") == "OperationOutcome":
            return server_text(outcome_text(body))
        if isinstance(body, dict) and "error" in body:
            description = body.get("error_description")
            said = f"{body['error']}: {description}" if description else str(body["error"])
            return server_text(said)
        return server_text(self.reason or f"HTTP {self.status}")

    def is_transient(self) -> bool:
        """A 5xx whose OperationOutcome has a `transient` issue (the client may retry)."""
        if self.status < 500:
            return False
        body = self._body()
        return isinstance(body, dict) and any(
            isinstance(issue, dict) and issue.get("code") == "transient"
            for issue in body.get("issue") or []
        )


def outcome_text(outcome: dict[str, Any]) -> str:
    """An OperationOutcome's issues as one line (severity: code: diagnostics)."""
    issues = [
        ": ".join(
            str(part)
            for part in (
                issue.get("severity"),
                issue.get("code"),
                issue.get("diagnostics") or (issue.get("details") or {}).get("text"),
            )
            if part
        )
        for issue in outcome.get("issue") or []
        if isinstance(issue, dict)
    ]
    return "; ".join(issues) or "an OperationOutcome without issues"


def fetch(
    client: httpx.Client,
    request: httpx.Request,
    settings: HttpSettings,
    what: str,
    limit: int = MAX_JSON_BYTES,
    deadline_s: float | None = None,
) -> Reply:
    """`request` sent and its response read (under `limit` bytes; with `deadline_s`, each
    response whole within that many seconds of its request, headers and body: `_within`), again
    after a 429 / 503 / transient 5xx as the server's `Retry-After` says, at most
    `settings.retries` more times. A network error is a `FhirServerError` naming `what`, not the
    network's own text."""
    for attempt in range(settings.retries + 1):
        if deadline_s is None:
            reply = _exchange(client, request, what, limit)
        else:
            reply = _within(client, request, what, limit, deadline_s)
        retried = reply.status in RETRIED_STATUSES or reply.is_transient()
        if not retried or attempt == settings.retries:
            return reply
        time.sleep(retry_after_s(reply.headers, settings))
    raise AssertionError("unreachable")


def _exchange(
    client: httpx.Client,
    request: httpx.Request,
    what: str,
    limit: int,
    abandoned: threading.Event | None = None,
) -> Reply:
    """`request` sent and its response read whole (see `fetch`)."""
    try:
        with client.stream(
            request.method, request.url, headers=request.headers, content=request.content
        ) as response:
            return Reply(
                response.status_code,
                response.headers,
                str(response.url),
                read_capped(response, limit, abandoned),
                response.reason_phrase,
            )
    except httpx.HTTPError as exc:
        raise FhirServerError(f"{what}: {type(exc).__name__} reaching the server") from exc


def _within(
    client: httpx.Client, request: httpx.Request, what: str, limit: int, deadline_s: float
) -> Reply:
    """`_exchange` in a thread of its own, waited for `deadline_s` seconds at most: connect and
    read timeouts bound each silence, not a server that drips its answer (headers or body) a byte
    at a time. At the deadline the answer is given up (`FhirServerError` naming the server and
    the bound); the thread stops at the next bytes the server sends, or its read timeout."""
    answer: Future[Reply] = Future()
    abandoned = threading.Event()

    def run() -> None:
        try:
            answer.set_result(_exchange(client, request, what, limit, abandoned))
        except Exception as exc:  # handed to the waiting thread
            answer.set_exception(exc)

    threading.Thread(target=run, name=f"fhir {what}", daemon=True).start()
    try:
        return answer.result(timeout=deadline_s)
    except TimeoutError:
        abandoned.set()
        raise FhirServerError(
            f"{what}: {request.url} sent no whole answer within {deadline_s:g} s"
        ) from None
