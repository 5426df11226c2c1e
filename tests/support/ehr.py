"""The EHR side of CDS Hooks for tests: an issuer with an ES384 key pair, its JWK Set served over
HTTP on 127.0.0.1 (a thread), and the JWTs it signs for each call (PyJWT)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from tests.support.http_thread import serving_in_thread

ISSUER = "https://ehr.test.invalid"
TENANT = "tenant-a"
FHIR_SERVER = f"{ISSUER}/fhir"
"""The EHR's FHIR server base URL."""
CLOSED_FHIR_SERVER = "http://127.0.0.1:9"
"""A plain-HTTP FHIR server base URL on a closed port (a hook's fetch of it fails at once)."""


@dataclass
class Ehr:
    """An EHR: its issuer URI, signing key and key id, and where its JWK Set is served."""

    jwks_url: str
    issuer: str = ISSUER
    kid: str = "ehr-key-1"
    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP384R1())
    )

    def jwks(self) -> dict[str, Any]:
        """The public JWK Set."""
        public = json.loads(ECAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [public | {"kid": self.kid, "use": "sig", "alg": "ES384"}]}

    def token(self, audience: str, *, headers: dict[str, Any] | None = None, **claims: Any) -> str:
        """A JWT for a call to `audience`: iss, aud, exp (+5 min), iat, jti, tenant, then
        `claims` (None removes one) and extra `headers`."""
        now = int(time.time())
        payload: dict[str, Any] = {
            "iss": self.issuer,
            "aud": audience,
            "exp": now + 300,
            "iat": now,
            "jti": str(uuid.uuid4()),
            "tenant": TENANT,
        }
        payload.update(claims)
        payload = {k: v for k, v in payload.items() if v is not None}
        header = {"kid": self.kid, "typ": "JWT"} | (headers or {})
        return jwt.encode(payload, self.key, algorithm="ES384", headers=header)

    def authorization(self, audience: str, **claims: Any) -> dict[str, str]:
        """The `Authorization` header of a call to `audience`."""
        return {"Authorization": f"Bearer {self.token(audience, **claims)}"}

    def issuers_setting(self, fhir_servers: list[str] | str) -> str:
        """`MEDTPE_CDS_ISSUERS` naming this EHR, whose calls may name `fhir_servers` (base
        URLs, or `"*"`: any)."""
        return json.dumps({self.issuer: {"jwks_url": self.jwks_url, "fhir_servers": fhir_servers}})

    def service_settings(self, base_url: str, fhir_server: str = FHIR_SERVER) -> dict[str, Any]:
        """`instant_settings` overrides of a CDS service at `base_url` this EHR calls, its calls
        allowed to name `fhir_server`."""
        return {
            "cds_issuers": json.loads(self.issuers_setting([fhir_server])),
            "cds_base_url": base_url,
        }


@contextmanager
def serving_ehr() -> Iterator[Ehr]:
    """An EHR whose JWK Set is served at `/jwks` on 127.0.0.1 while the block runs."""
    document: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = document["jwks"] if self.path == "/jwks" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving_in_thread(Handler) as server:
        ehr = Ehr(jwks_url=f"http://127.0.0.1:{server.server_address[1]}/jwks")
        document["jwks"] = json.dumps(ehr.jwks()).encode()
        yield ehr
