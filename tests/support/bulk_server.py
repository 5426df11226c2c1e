"""A FHIR Bulk Data server for tests, written to the Bulk Data IG (3.0) and SMART Backend Services,
served over real HTTP on 127.0.0.1 (a thread):

- `GET /fhir/.well-known/smart-configuration`: the token endpoint, `private_key_jwt`, RS384 and
  ES384;
- `POST /auth/token`: `client_credentials` with a client assertion, verified against the client's
  registered public JWK Set (`iss` = `sub` = the client id, `aud` = this URL, `exp` at most five
  minutes on, a `jti` never seen before, the header's `kid`, RS384 / ES384); answers a bearer
  token of `token_lifetime_s`;
- `GET /fhir/$export`, `/fhir/Patient/$export`, `/fhir/Group/<id>/$export` (`Prefer:
  respond-async`, `_type`, `_since` on `meta.lastUpdated`) → 202 and the status URL;
- `GET /fhir/bulkstatus/<id>`: 202 with `X-Progress` and `Retry-After` for `polls` polls, then the
  manifest; `DELETE` cancels (then 404);
- `GET /fhir/files/<id>/<name>`: NDJSON (gzip encoded when asked and `gzip` is on), `Range`
  requests, the token required.

Faults a test switches on: `throttle` (the next kick-offs answer 429 with `Retry-After`),
`fail_group` (a Group whose export fails with an OperationOutcome), `drop_after` (the next file
download breaks after that many bytes), `revoke_at_next_poll` (the tokens issued so far answer
401 from the next status poll on), `requires_token` False (files served without a token).
Every request is logged (`requests`: method, path, whether it carried a valid token, its
headers) so a test can check where the token went.
"""

from __future__ import annotations

import gzip
import json
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from medtpe.batch.bulk_client import ExportSettings, ServerAccess
from medtpe.batch.fhir_export import referenced_id
from medtpe.batch.fhir_http import HttpSettings
from medtpe.batch.smart_backend import ClientKey
from tests.support.http_thread import serving_in_thread

ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
ALGORITHMS = ["RS384", "ES384"]


def resources_by_type(bundles: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The resources of patients' Bundles by type, in Bundle order (an export's content)."""
    by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for bundle in bundles:
        for entry in bundle["entry"]:
            by_type[entry["resource"]["resourceType"]].append(entry["resource"])
    return dict(by_type)


def write_export(
    by_type: dict[str, list[dict[str, Any]]],
    out: Path,
    files_per_type: int = 1,
    gzipped: Sequence[str] = (),
    manifest: bool = False,
) -> Path:
    """An export directory: each type's resources in `files_per_type` files (`Type.k.ndjson`,
    `.ndjson.gz` for the types in `gzipped`), with a manifest when asked."""
    out.mkdir(parents=True, exist_ok=True)
    outputs = []
    for kind, resources in by_type.items():
        size = -(-len(resources) // files_per_type)
        for k in range(files_per_type):
            part = resources[k * size : (k + 1) * size]
            if not part and k:
                continue
            text = "".join(json.dumps(r) + "\n" for r in part).encode()
            name = f"{kind}.{k:03d}.ndjson" + (".gz" if kind in gzipped else "")
            (out / name).write_bytes(gzip.compress(text) if kind in gzipped else text)
            outputs.append({"type": kind, "url": name, "count": len(part)})
    if manifest:
        document = {"transactionTime": "2026-11-27T00:00:00Z", "output": outputs, "error": []}
        (out / "manifest.json").write_text(json.dumps(document))
    return out


@dataclass
class _Export:
    request: str
    files: dict[str, bytes]
    counts: dict[str, int]
    polls_left: int
    failed: bool = False
    deleted: bool = False


@dataclass
class BulkServer:
    """The server's data and switches (see the module docstring)."""

    resources: dict[str, list[dict[str, Any]]]
    groups: dict[str, list[str]] = field(default_factory=dict)
    clients: dict[str, dict[str, Any]] = field(default_factory=dict)
    """client id -> its registered public JWK Set."""
    url: str = ""
    polls: int = 1
    retry_after_s: int = 1
    token_lifetime_s: int = 300
    gzip: bool = False
    requires_token: bool = True
    throttle: int = 0
    fail_group: str | None = None
    drop_after: int | None = None
    revoke_at_next_poll: bool = False
    algorithms_seen: list[str] = field(default_factory=list)
    """The signing algorithm of each client assertion verified."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    tokens: dict[str, float] = field(default_factory=dict)
    seen_jti: set[str] = field(default_factory=set)
    exports: dict[str, _Export] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base(self) -> str:
        """The FHIR base URL."""
        return f"{self.url}/fhir"

    @property
    def token_url(self) -> str:
        """The token endpoint."""
        return f"{self.url}/auth/token"

    def revoke_tokens(self) -> None:
        """Every token issued so far is refused from now on (401)."""
        with self.lock:
            self.tokens.clear()

    def valid(self, authorization: str | None) -> bool:
        """Whether an Authorization header carries a live token."""
        if not authorization or not authorization.startswith("Bearer "):
            return False
        with self.lock:
            expires = self.tokens.get(authorization.removeprefix("Bearer "))
        return expires is not None and expires > time.time()

    # --- token endpoint -------------------------------------------------------------------

    def issue(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """The token endpoint's answer to a form."""
        if form.get("grant_type") != "client_credentials":
            return 400, {"error": "unsupported_grant_type"}
        if form.get("client_assertion_type") != ASSERTION_TYPE:
            return 400, {"error": "invalid_request", "error_description": "assertion type"}
        assertion = form.get("client_assertion", "")
        try:
            header = jwt.get_unverified_header(assertion)
            unverified = jwt.decode(assertion, options={"verify_signature": False})
            client = str(unverified.get("iss"))
            keys = self.clients[client]["keys"]
            (jwk,) = [k for k in keys if k.get("kid") == header.get("kid")]
            key = jwt.PyJWK(jwk).key
            claims = jwt.decode(
                assertion,
                key,
                algorithms=ALGORITHMS,
                audience=self.token_url,
                issuer=client,
                options={"require": ["iss", "sub", "aud", "exp", "jti"]},
            )
        except (jwt.PyJWTError, KeyError, ValueError) as exc:
            return 401, {"error": "invalid_client", "error_description": type(exc).__name__}
        if claims["sub"] != client or claims["exp"] > time.time() + 300 + 5:
            return 401, {"error": "invalid_client", "error_description": "sub or exp"}
        with self.lock:
            self.algorithms_seen.append(header["alg"])
            if claims["jti"] in self.seen_jti:
                return 401, {"error": "invalid_client", "error_description": "jti replayed"}
            self.seen_jti.add(claims["jti"])
            token = secrets.token_urlsafe(24)
            self.tokens[token] = time.time() + self.token_lifetime_s
        scope = form.get("scope", "")
        body = {"access_token": token, "token_type": "bearer", "scope": scope}
        return 200, body | {"expires_in": self.token_lifetime_s}

    # --- export ---------------------------------------------------------------------------

    def kick_off(self, path: str, query: dict[str, list[str]]) -> _Export | tuple[int, Any]:
        """A new export of `path` (`$export`, `Patient/$export`, `Group/<id>/$export`)."""
        patients: set[str] | None = None
        if path.startswith("Group/"):
            group = path.split("/")[1]
            if group not in self.groups:
                return 404, outcome("error", "not-found", f"Group/{group} is not known")
            patients = set(self.groups[group])
        types = set(query.get("_type", [""])[0].split(",")) - {""}
        since = query.get("_since", [None])[0]
        files: dict[str, bytes] = {}
        counts: dict[str, int] = {}
        for kind, resources in self.resources.items():
            if types and kind not in types:
                continue
            kept = [
                r
                for r in resources
                if (patients is None or _patient_of(r) in patients or _patient_of(r) is None)
                and (since is None or r.get("meta", {}).get("lastUpdated", "") >= since)
                and (path == "$export" or _patient_of(r) is not None)
            ]
            if kept:
                text = "".join(json.dumps(r) + "\n" for r in kept).encode()
                files[f"{kind}.ndjson"] = text
                counts[f"{kind}.ndjson"] = len(kept)
        failed = path.startswith("Group/") and path.split("/")[1] == self.fail_group
        return _Export(path, files, counts, self.polls, failed=failed)

    def manifest(self, export_id: str, export: _Export) -> dict[str, Any]:
        """The completed export's manifest."""
        return {
            "transactionTime": "2026-11-27T02:00:00Z",
            "request": f"{self.base}/{export.request}",
            "requiresAccessToken": self.requires_token,
            "output": [
                {
                    "type": name.split(".")[0],
                    "url": f"{self.base}/files/{export_id}/{name}",
                    "count": export.counts[name],
                }
                for name in export.files
            ],
            "error": [],
        }


def outcome(severity: str, code: str, text: str) -> dict[str, Any]:
    """An OperationOutcome of one issue."""
    issue = {"severity": severity, "code": code, "diagnostics": text}
    return {"resourceType": "OperationOutcome", "issue": [issue]}


def _patient_of(resource: dict[str, Any]) -> str | None:
    if resource["resourceType"] == "Patient":
        return resource["id"]
    for name in ("subject", "patient"):
        found = referenced_id((resource.get(name) or {}).get("reference"), "Patient")
        if found:
            return found
    return None


def _handler(server: BulkServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _log(self) -> bool:
            valid = server.valid(self.headers.get("Authorization"))
            entry = {
                "method": self.command,
                "path": self.path,
                "token": valid,
                "headers": dict(self.headers),
            }
            with server.lock:
                server.requests.append(entry)
            return valid

        def _send(self, status: int, body: Any = None, headers: dict[str, str] | None = None):
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if body is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            self._log()
            length = int(self.headers.get("Content-Length", "0"))
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            if urlsplit(self.path).path != "/auth/token":
                self._send(404, outcome("error", "not-found", self.path))
                return
            status, body = server.issue(form)
            self._send(status, body, {"Cache-Control": "no-store"})

        def do_DELETE(self) -> None:
            valid = self._log()
            export_id = urlsplit(self.path).path.removeprefix("/fhir/bulkstatus/")
            export = server.exports.get(export_id)
            if not valid:
                self._send(401, outcome("error", "login", "a valid token is required"))
            elif export is None or export.deleted:
                self._send(404, outcome("error", "not-found", "no such export"))
            else:
                export.deleted = True
                self._send(202)

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            path, query = parts.path, parse_qs(parts.query)
            if path.startswith("/fhir/bulkstatus/") and server.revoke_at_next_poll:
                server.revoke_at_next_poll = False
                server.revoke_tokens()
            valid = self._log()
            if path == "/fhir/.well-known/smart-configuration":
                self._send(200, smart_configuration(server))
                return
            if path.startswith("/fhir/files/") and not server.requires_token:
                self._file(*path.removeprefix("/fhir/files/").split("/", 1))
                return
            if not valid:
                self._send(401, outcome("error", "login", "a valid token is required"))
                return
            if path.endswith("$export"):
                self._kick_off(path.removeprefix("/fhir/"), query)
            elif path.startswith("/fhir/bulkstatus/"):
                self._status(path.removeprefix("/fhir/bulkstatus/"))
            elif path.startswith("/fhir/files/"):
                self._file(*path.removeprefix("/fhir/files/").split("/", 1))
            else:
                self._send(404, outcome("error", "not-found", path))

        def _kick_off(self, path: str, query: dict[str, list[str]]) -> None:
            if self.headers.get("Prefer") != "respond-async":
                self._send(400, outcome("error", "invalid", "Prefer: respond-async is required"))
                return
            with server.lock:
                throttled = server.throttle > 0
                server.throttle -= throttled
            if throttled:
                body = outcome("error", "throttled", "too many exports")
                self._send(429, body, {"Retry-After": str(server.retry_after_s)})
                return
            made = server.kick_off(path, query)
            if isinstance(made, tuple):
                self._send(*made)
                return
            export_id = secrets.token_hex(6)
            server.exports[export_id] = made
            location = f"{server.base}/bulkstatus/{export_id}"
            self._send(202, None, {"Content-Location": location})

        def _status(self, export_id: str) -> None:
            export = server.exports.get(export_id)
            if export is None or export.deleted:
                self._send(404, outcome("error", "not-found", "no such export"))
                return
            if export.polls_left > 0:
                export.polls_left -= 1
                headers = {"X-Progress": "in progress", "Retry-After": str(server.retry_after_s)}
                self._send(202, None, headers)
            elif export.failed:
                self._send(500, outcome("fatal", "exception", "the export of this Group failed"))
            else:
                self._send(200, server.manifest(export_id, export))

        def _file(self, export_id: str, name: str) -> None:
            export = server.exports.get(export_id)
            if export is None or name not in export.files:
                self._send(404, outcome("error", "not-found", "no such file"))
                return
            data = export.files[name]
            headers = {"Content-Type": "application/fhir+ndjson"}
            if server.gzip and "gzip" in self.headers.get("Accept-Encoding", ""):
                data = gzip.compress(data, mtime=0)
                headers["Content-Encoding"] = "gzip"
            start = 0
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes="):
                start = int(ranged.removeprefix("bytes=").split("-")[0])
                if start >= len(data):
                    self._send(416, None, {"Content-Range": f"bytes */{len(data)}"})
                    return
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            self.send_response(206 if start else 200)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with server.lock:
                cut, server.drop_after = server.drop_after, None
            if cut is not None:
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    return Handler


def smart_configuration(server: BulkServer) -> dict[str, Any]:
    """The server's `.well-known/smart-configuration`."""
    return {
        "token_endpoint": server.token_url,
        "token_endpoint_auth_methods_supported": ["private_key_jwt"],
        "token_endpoint_auth_signing_alg_values_supported": ALGORITHMS,
        "grant_types_supported": ["client_credentials"],
        "scopes_supported": ["system/*.rs"],
        "capabilities": ["client-confidential-asymmetric"],
    }


def pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    """A private key as unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def heart_rate(observation_id: str, patient: str, value: float) -> dict[str, Any]:
    """An Observation of `patient`'s heart rate (LOINC 8867-4, `value` /min) on 2150-01-01."""
    return {
        "resourceType": "Observation",
        "id": observation_id,
        "status": "final",
        "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}]},
        "subject": {"reference": f"Patient/{patient}"},
        "effectiveDateTime": "2150-01-01T00:00:00Z",
        "valueQuantity": {"value": value, "unit": "/min"},
    }


BULK_CLIENT = "medtpe-nightly"
"""The night job's client id at a test Bulk Data server."""


def es384_key() -> ClientKey:
    """A new ES384 client key (SMART Backend Services)."""
    return ClientKey.from_pem(pem(ec.generate_private_key(ec.SECP384R1())))


def fast_export(retries: int) -> ExportSettings:
    """Export settings that wait 10 ms for a server's `Retry-After`-less retry and at most 50 ms
    for any, with `retries` retries."""
    return ExportSettings(http=HttpSettings(default_wait_s=0.01, max_wait_s=0.05, retries=retries))


def server_access(
    server: BulkServer, client_id: str, key: ClientKey, key_dir: Path
) -> ServerAccess:
    """How the client `client_id` reaches `server` with `key` (written as a PEM file in
    `key_dir`)."""
    path = key_dir / f"{key.kid}.pem"
    path.write_bytes(pem(key.key))
    return ServerAccess(server.base, client_id, path, key.kid)


@contextmanager
def serving_bulk_data(server: BulkServer) -> Iterator[BulkServer]:
    """`server` on 127.0.0.1 (a free port) while the block runs; `server.url` is set."""
    with serving_in_thread(_handler(server)) as http:
        server.url = f"http://127.0.0.1:{http.server_address[1]}"
        yield server
