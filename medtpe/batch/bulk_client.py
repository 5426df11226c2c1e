"""A FHIR Bulk Data (3.0) export downloaded into a directory, resumably.

1. Kick-off: `GET [base]/$export`, `[base]/Patient/$export` or `[base]/Group/[id]/$export` with
   `Accept: application/fhir+json`, `Prefer: respond-async`, `_type`, `_since` and
   `_outputFormat=application/fhir+ndjson` → 202 and the status URL (`Content-Location`).
2. Poll the status URL: 202 (`X-Progress`, `Retry-After`: waited, within a cap) until 200 and the
   manifest (`transactionTime`, `requiresAccessToken`, `output`, `error`).
3. Download each output file to `<Type>.<k>.ndjson` (`.ndjson.gz` when the server sends it gzip
   encoded; kept as sent), through a `.part` file resumed with a `Range` request; then the error
   files (OperationOutcomes), then the directory's own `manifest.json`, whose `url`s are the local
   file names (what `medtpe.batch.fhir_export` reads), last: a directory with it is complete.
4. `DELETE` the status URL: the server may drop the files (also on Ctrl-C while waiting: the
   export is cancelled).

The directory's `bulk-export.json` keeps the request, the status URL and, once there, the
server's manifest: a second run with the same request resumes where the first stopped (polls
again, downloads the missing files and the rest of a partial one); another request in the same
directory is refused. Every request carries the SMART Backend Services token
(`medtpe.batch.smart_backend`) when one is configured, but only to the FHIR server's origin
(`medtpe.core.fhir.url_guard`, the rule both FHIR clients share): a
status URL elsewhere is refused, a file elsewhere is fetched without it when the manifest says files
need no token (`requiresAccessToken: false`) and refused when they do; redirects are followed by
hand, at most `MAX_REDIRECTS`, the token only on hops to the server's origin. A 401 gets one new
token and one more try; 429 / 503 wait `Retry-After` (bounded); an OperationOutcome is the error's
text.

Nothing of the manifest is trusted: before any download every entry is checked
(`check_manifest`: `type` one of FHIR R4's resource types, `url` an HTTPS URL (loopback: HTTP)
that the token may reach, `count` a whole number), a bad one refused with a `ManifestError`
naming its field, and the export not done. Local file names are made by the client (the checked
type and its own index), never taken from the manifest, and every file written is checked to
resolve inside the export directory (a symbolic link planted there is refused).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
from tqdm import tqdm

from medtpe.batch.defaults import DEFAULT_SCOPE
from medtpe.batch.fhir_export import FHIR_ID, MANIFEST
from medtpe.batch.fhir_http import (
    FhirServerError,
    HttpSettings,
    Reply,
    check_secure,
    fetch,
    read_capped,
    resolve,
    retry_after_s,
    token_may_go,
    token_scope,
)
from medtpe.batch.fhir_resource_types import R4_RESOURCE_TYPES
from medtpe.batch.smart_backend import ClientKey, SmartBackendAuth
from medtpe.core.fhir.mapping import READ_TYPES

log = logging.getLogger(__name__)

STATE_FILE = "bulk-export.json"
FHIR_JSON = "application/fhir+json"
NDJSON = "application/fhir+ndjson"
MAX_REDIRECTS = 5
DEFAULT_TYPES = tuple(sorted(READ_TYPES))
"""`_type` by default: the resource types the site mapping reads."""
ERROR_BODY_BYTES = 64 * 1024
"""The most read of an error's body."""

Level = Literal["system", "patient", "group"]


class ExportFailedError(FhirServerError):
    """The server could not make the export (its OperationOutcome in the message)."""


class ExportGoneError(ExportFailedError):
    """The status URL is no longer known to the server (expired or cancelled export)."""


class ManifestError(ExportFailedError):
    """The server's manifest holds what the client refuses (the message names the field)."""


@dataclass(frozen=True)
class ExportRequest:
    """What to export."""

    level: Level = "patient"
    group: str | None = None
    """The Group's id (level `group`)."""
    types: tuple[str, ...] = DEFAULT_TYPES
    since: str | None = None
    """`_since`: only resources changed after this FHIR instant (a nightly increment)."""

    def path(self) -> str:
        """The kick-off path under the base URL."""
        if self.level == "group":
            if not self.group or not FHIR_ID.fullmatch(self.group):
                raise ValueError(f"{self.group!r} is no Group id")
            return f"Group/{self.group}/$export"
        return "Patient/$export" if self.level == "patient" else "$export"

    def params(self) -> dict[str, str]:
        """The kick-off's query parameters."""
        params = {"_outputFormat": NDJSON}
        if self.types:
            params["_type"] = ",".join(self.types)
        if self.since:
            params["_since"] = self.since
        return params


@dataclass(frozen=True)
class ExportSettings:
    """Caps of one export."""

    http: HttpSettings = field(default_factory=HttpSettings)
    deadline_s: float = 12 * 3600.0
    """The longest wait for the server to finish the export."""
    max_file_bytes: int = 256 * 1024**3
    """A larger output file is refused."""


@dataclass
class ExportResult:
    """What an export gave (the job's summary reports it)."""

    directory: str
    transaction_time: str | None
    files: int
    resources: dict[str, int]
    """Manifest counts by type (where the server gave them)."""
    error_files: int
    bytes_downloaded: int
    resumed: bool
    seconds: float


class BulkDataClient:
    """Bulk Data export of one FHIR server (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        client: httpx.Client,
        auth: SmartBackendAuth | None = None,
        settings: ExportSettings | None = None,
    ) -> None:
        check_secure(base_url, "the FHIR server")
        self.base = base_url.rstrip("/") + "/"
        self.scope = token_scope(self.base)
        self.client, self.auth = client, auth
        self.settings = settings or ExportSettings()

    # --- requests -------------------------------------------------------------------------

    def _headers(self, url: str, accept: str, with_token: bool = True) -> dict[str, str]:
        headers = {"Accept": accept}
        if with_token and self.auth is not None:
            if not token_may_go(self.scope, url):  # never reached: callers check first
                raise FhirServerError(f"no token for {url}: not the FHIR server's origin")
            headers["Authorization"] = f"Bearer {self.auth.token()}"
        return headers

    def _fetch(
        self,
        method: str,
        url: str,
        what: str,
        accept: str = FHIR_JSON,
        extra: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
    ) -> Reply:
        """A request to the FHIR server's origin (token attached), once more with a new token
        after a 401."""
        if not token_may_go(self.scope, url):
            raise FhirServerError(f"{what}: {url} is not on the FHIR server's origin")
        for attempt in range(2):
            headers = self._headers(url, accept) | (extra or {})
            request = httpx.Request(method, url, headers=headers, params=params)
            reply = fetch(self.client, request, self.settings.http, what)
            if reply.status == 401 and self.auth is not None and attempt == 0:
                self.auth.refresh()
                continue
            return reply
        raise AssertionError("unreachable")

    def kick_off(self, request: ExportRequest) -> str:
        """Start the export; the status URL."""
        url = self.base + request.path()
        reply = self._fetch(
            "GET", url, "kick-off", extra={"Prefer": "respond-async"}, params=request.params()
        )
        if reply.status != 202:
            raise ExportFailedError(
                f"the export kick-off ({url}) answered HTTP {reply.status}: {reply.explanation()}"
            )
        location = reply.headers.get("Content-Location")
        if not location:
            raise ExportFailedError("the kick-off's 202 names no status URL (Content-Location)")
        status_url = resolve(url, location)
        if not token_may_go(self.scope, status_url):
            raise ExportFailedError(
                f"the status URL {status_url} is not on the FHIR server's origin: the access "
                "token is not sent there"
            )
        return status_url

    def wait(self, status_url: str, progress: bool = True) -> dict[str, Any]:
        """Poll the status URL until the manifest (202: wait `Retry-After`); a failed export is
        an `ExportFailedError`. Ctrl-C cancels the export on the server (`DELETE`)."""
        deadline = time.monotonic() + self.settings.deadline_s
        bar = tqdm(desc="export", unit="poll", disable=not progress)
        try:
            while True:
                reply = self._fetch("GET", status_url, "export status", accept="application/json")
                if reply.status == 200:
                    return self._manifest(reply)
                if reply.status in (404, 410):
                    raise ExportGoneError(
                        f"the export at {status_url} is gone (HTTP {reply.status})"
                    )
                if reply.status not in (202, 429):
                    raise ExportFailedError(
                        f"the export failed: HTTP {reply.status}: {reply.explanation()}"
                    )
                bar.set_postfix_str(reply.headers.get("X-Progress", "")[:60])
                bar.update()
                wait = retry_after_s(reply.headers, self.settings.http)
                if time.monotonic() + wait > deadline:
                    raise ExportFailedError(
                        f"the export took longer than {self.settings.deadline_s:.0f} s: waiting "
                        f"stopped (status URL {status_url})"
                    )
                time.sleep(wait)
        except KeyboardInterrupt:
            self.cancel(status_url)
            raise
        finally:
            bar.close()

    def _manifest(self, reply: Reply) -> dict[str, Any]:
        manifest = reply.json()
        check_manifest(manifest, self.base)
        return manifest

    def cancel(self, status_url: str) -> None:
        """Tell the server it may delete the export (best effort; errors are logged)."""
        try:
            reply = self._fetch("DELETE", status_url, "export cancel")
            if reply.status >= 400:
                log.warning("the export's DELETE answered HTTP %s", reply.status)
        except FhirServerError as exc:
            log.warning("%s", exc)

    # --- downloads ------------------------------------------------------------------------

    def download(
        self, url: str, target: Path, requires_token: bool, progress: tqdm | None = None
    ) -> Path:
        """One output file into `target` (`.ndjson`; `.ndjson.gz` when sent gzip encoded),
        resuming a `.part` left by an earlier run; the file's path."""
        for suffix in (".part", ".gz.part"):
            inside(target.parent, target.name + suffix)
        for suffix in ("", ".gz"):
            done = inside(target.parent, target.name + suffix)
            if done.is_file():
                return done
        if requires_token and not token_may_go(self.scope, url):
            raise ManifestError(
                f"the manifest asks for the access token at {url}, not the FHIR server's "
                "origin: refused"
            )
        for attempt in range(self.settings.http.retries + 1):
            try:
                return self._download_once(url, target, requires_token, progress)
            except _Retry as retry:
                if attempt == self.settings.http.retries:
                    raise FhirServerError(f"{url}: still HTTP {retry.status}") from None
                time.sleep(retry.wait)
        raise AssertionError("unreachable")

    def _download_once(
        self, url: str, target: Path, requires_token: bool, progress: tqdm | None
    ) -> Path:
        gz_part = target.with_name(target.name + ".gz.part")
        plain_part = target.with_name(target.name + ".part")
        part = gz_part if gz_part.is_file() else plain_part
        offset = part.stat().st_size if part.is_file() else 0
        extra = {"Accept-Encoding": "gzip"}
        if offset:
            extra = {
                "Accept-Encoding": "gzip" if part is gz_part else "identity",
                "Range": f"bytes={offset}-",
            }
        refreshed = False
        hops = 0
        while True:
            with_token = requires_token and token_may_go(self.scope, url)
            headers = self._headers(url, NDJSON, with_token=with_token)
            try:
                with self.client.stream("GET", url, headers=headers | extra) as response:
                    status = response.status_code
                    if status in (301, 302, 303, 307, 308):
                        hops += 1
                        location = response.headers.get("Location")
                        if hops > MAX_REDIRECTS or not location:
                            raise FhirServerError(f"{url}: too many redirects")
                        url = resolve(url, location)
                        check_secure(url, "a redirect")
                        continue
                    if status == 401 and self.auth is not None and not refreshed:
                        refreshed = True
                        self.auth.refresh()
                        continue
                    if status in (429, 503):
                        raise _Retry(status, retry_after_s(response.headers, self.settings.http))
                    if status == 416 and offset:  # the part was already whole
                        return self._finish(part, target)
                    if status not in (200, 206):
                        body = read_capped(response, ERROR_BODY_BYTES)
                        reply = Reply(status, response.headers, url, body, "")
                        raise FhirServerError(
                            f"downloading {url}: HTTP {status}: {reply.explanation()}"
                        )
                    gzipped = response.headers.get("Content-Encoding", "").lower() == "gzip"
                    appending = status == 206 and offset and (part is gz_part) == gzipped
                    if not appending:
                        for old in (gz_part, plain_part):
                            old.unlink(missing_ok=True)
                        part, offset = (gz_part if gzipped else plain_part), 0
                    self._write(response, part, offset, progress)
                    return self._finish(part, target)
            except httpx.HTTPError as exc:
                raise FhirServerError(
                    f"downloading {url}: {type(exc).__name__} (rerun to resume)"
                ) from exc

    def _write(
        self, response: httpx.Response, part: Path, offset: int, progress: tqdm | None
    ) -> None:
        with part.open("ab" if offset else "wb") as file:
            written = offset
            for chunk in response.iter_raw():  # as it arrives: a break keeps it all
                written += len(chunk)
                if written > self.settings.max_file_bytes:
                    raise FhirServerError(
                        f"{response.request.url}: a file over {self.settings.max_file_bytes} bytes"
                    )
                file.write(chunk)
                if progress is not None:
                    progress.update(len(chunk))

    @staticmethod
    def _finish(part: Path, target: Path) -> Path:
        final = target.with_name(target.name + (".gz" if part.name.endswith(".gz.part") else ""))
        os.replace(part, final)
        return final

    # --- the whole export -----------------------------------------------------------------

    def export(
        self, request: ExportRequest, directory: Path, progress: bool = True
    ) -> ExportResult:
        """The export of `request` in `directory` (see the module docstring): made, or resumed,
        or found complete."""
        start = time.perf_counter()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state_path = inside(directory, STATE_FILE)
        wanted = {"base": self.base, "request": asdict(request)}
        state: dict[str, Any] = {}
        if state_path.is_file():
            state = json.loads(state_path.read_text(encoding="utf-8"))
            if {k: state.get(k) for k in wanted} != json.loads(json.dumps(wanted)):
                raise FhirServerError(
                    f"{directory} holds another export (another server or request): give a "
                    "new directory"
                )
        resumed = bool(state)
        if (directory / MANIFEST).is_file():
            return self._result(directory, state, 0, resumed, start)
        if state.get("manifest") is None:
            if state.get("status_url") is not None:
                try:
                    state["manifest"] = self.wait(state["status_url"], progress)
                except ExportGoneError:
                    log.warning("the earlier export is gone on the server: exporting anew")
                    state["status_url"] = None
            if state.get("status_url") is None:
                state = {**wanted, "status_url": self.kick_off(request), "manifest": None}
                _write_json(state_path, state)
                state["manifest"] = self.wait(state["status_url"], progress)
            _write_json(state_path, state)
        downloaded = self._download_all(state["manifest"], directory, progress)
        self.cancel(state["status_url"])  # done: the server may delete the files
        return self._result(directory, state, downloaded, resumed, start)

    def _download_all(self, manifest: dict[str, Any], directory: Path, progress: bool) -> int:
        requires_token = check_manifest(manifest, self.base)
        local: dict[str, Any] = {
            k: manifest.get(k) for k in ("transactionTime", "request", "requiresAccessToken")
        }
        per_type: Counter[str] = Counter()
        before = _bytes_in(directory)
        with tqdm(desc="download", unit="B", unit_scale=True, disable=not progress) as bar:
            for key in ("output", "error"):
                entries = []
                for entry in manifest.get(key) or []:
                    kind = entry.get("type") or "OperationOutcome"  # checked: an R4 type
                    name = f"{kind}.{per_type[kind]:03d}.ndjson"  # made here, never the server's
                    if key == "error":
                        name = f"error.{name}"
                    per_type[kind] += 1
                    url = resolve(self.base, entry["url"])
                    path = self.download(url, inside(directory, name), requires_token, bar)
                    entries.append({**entry, "url": path.name})
                local[key] = entries
        _write_json(inside(directory, MANIFEST), local)  # last: the directory is complete
        return _bytes_in(directory) - before

    def _result(
        self, directory: Path, state: dict[str, Any], downloaded: int, resumed: bool, start: float
    ) -> ExportResult:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        counts: Counter[str] = Counter()
        for entry in manifest.get("output") or []:
            if isinstance(entry.get("count"), int):
                counts[str(entry.get("type"))] += entry["count"]
        return ExportResult(
            directory=str(directory),
            transaction_time=manifest.get("transactionTime"),
            files=len(manifest.get("output") or []),
            resources=dict(sorted(counts.items())),
            error_files=len(manifest.get("error") or []),
            bytes_downloaded=downloaded,
            resumed=resumed,
            seconds=time.perf_counter() - start,
        )


class _Retry(Exception):
    def __init__(self, status: int, wait: float) -> None:
        super().__init__(status)
        self.status, self.wait = status, wait


def check_manifest(manifest: Any, base: str) -> bool:
    """Refuse a manifest (`ManifestError` naming the field) unless every `output` and `error`
    entry has a `type` of FHIR R4's resource types (an `error` entry may leave it out), a `url`
    that resolves against `base` to HTTPS (loopback: HTTP) on the FHIR server's origin when the
    files need the token, and a `count`, if any, that is a whole number; whether the files need
    the access token (`requiresAccessToken`, true when absent)."""
    if not isinstance(manifest, dict):
        raise ManifestError("the export's manifest is no JSON object: refused")
    requires_token = manifest.get("requiresAccessToken", True)
    if not isinstance(requires_token, bool):
        raise ManifestError(_refused("requiresAccessToken", requires_token, "is no boolean"))
    if not isinstance(manifest.get("output"), list):
        raise ManifestError("the export's manifest has no list of output files (output)")
    if not isinstance(manifest.get("error") or [], list):
        raise ManifestError(_refused("error", manifest["error"], "is no list"))
    for key in ("output", "error"):
        for index, entry in enumerate(manifest.get(key) or []):
            where = f"{key}[{index}]"
            if not isinstance(entry, dict):
                raise ManifestError(_refused(where, entry, "is no JSON object"))
            kind = entry.get("type", "OperationOutcome" if key == "error" else None)
            if not (isinstance(kind, str) and kind in R4_RESOURCE_TYPES):
                raise ManifestError(_refused(f"{where}.type", kind, "is no FHIR R4 resource type"))
            count = entry.get("count", 0)
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ManifestError(_refused(f"{where}.count", count, "is no whole number"))
            url = entry.get("url")
            try:
                if not isinstance(url, str):
                    raise ValueError("no string")
                absolute = resolve(base, url)
                check_secure(absolute, "the file")
            except (ValueError, FhirServerError) as exc:
                raise ManifestError(_refused(f"{where}.url", url, f"is refused ({exc})")) from None
            if requires_token and not token_may_go(token_scope(base), absolute):
                raise ManifestError(
                    f"the manifest asks for the access token at {absolute} ({where}.url), not the "
                    "FHIR server's origin: refused"
                )
    return requires_token


def _refused(field: str, value: Any, why: str) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return f"the export's manifest: {field} {shown} {why}: refused"


def inside(directory: Path, name: str) -> Path:
    """`directory / name`, refused (`FhirServerError`) unless it resolves to a file directly in
    `directory` (a name with a separator, `..`, or a symbolic link leading elsewhere)."""
    path = Path(directory) / name
    if Path(name).name != name or path.resolve().parent != Path(directory).resolve():
        raise FhirServerError(f"{path} is not a file of {directory}: refused")
    return path


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _bytes_in(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


@dataclass(frozen=True)
class ServerAccess:
    """How to reach and authorise at a FHIR server (SMART Backend Services when `client_id` is
    given; else no token: an open server)."""

    base_url: str
    client_id: str | None = None
    key_path: Path | None = None
    """The client's PEM private key (None: the `MEDTPE_FHIR_CLIENT_KEY` variable's PEM)."""
    kid: str | None = None
    scope: str = DEFAULT_SCOPE


def export_from_server(
    access: ServerAccess,
    request: ExportRequest,
    directory: Path,
    settings: ExportSettings | None = None,
    environ: dict[str, str] | None = None,
    progress: bool = True,
) -> ExportResult:
    """The export of `request` from the server into `directory` (made, resumed or found done)."""
    settings = settings or ExportSettings()
    with settings.http.client() as client:
        auth = None
        if access.client_id is not None:
            key = ClientKey.load(access.key_path, dict(environ or os.environ), access.kid)
            auth = SmartBackendAuth(
                access.base_url, access.client_id, key, client, access.scope, settings.http
            )
        else:
            log.warning("no --client-id: exporting from %s without a token", access.base_url)
        bulk = BulkDataClient(access.base_url, client, auth, settings)
        return bulk.export(request, directory, progress)
