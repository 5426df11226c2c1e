"""SMART Backend Services (SMART App Launch 2.x): a system-level access token for the batch
job, obtained with the client's own key, no user involved.

The FHIR server's `.well-known/smart-configuration` names its `token_endpoint`; the client POSTs
`grant_type=client_credentials`, the scope (`system/*.rs` by default) and a client assertion: a
JWT signed RS384 (an RSA key) or ES384 (a P-384 key) with `iss` = `sub` = the client id, `aud` =
the token endpoint's URL, `exp` five minutes on, a unique `jti` and the key's `kid` in its header.
The EHR checks it against the public keys it registered for the client (`public_jwks`).

The key comes from a PEM file or the PEM text in an environment variable; it is never logged nor
shown (`ClientKey`'s repr names the algorithm and kid only), nor is the token. The token is kept
until a minute before it expires and fetched again then, or at once after a 401 (`refresh`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from medtpe.batch.defaults import DEFAULT_SCOPE
from medtpe.batch.fhir_http import FhirServerError, HttpSettings, check_secure, fetch

ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
ASSERTION_LIFETIME_S = 300
"""The client assertion's `exp` (the spec's maximum: five minutes)."""
EXPIRY_MARGIN_S = 60
"""A token this close to its expiry is fetched again."""
DEFAULT_TOKEN_LIFETIME_S = 300
"""Assumed when the token response has no `expires_in`."""
CONFIGURATION_PATH = ".well-known/smart-configuration"
KEY_ENV = "MEDTPE_FHIR_CLIENT_KEY"
"""The environment variable holding the client's private key (PEM text)."""


class SmartAuthError(FhirServerError):
    """The client could not be authorised (configuration, key, or the token endpoint's
    refusal, with its OAuth error)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class ClientKey:
    """The client's private signing key, its algorithm and key id."""

    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey = field(repr=False)
    algorithm: str
    kid: str

    @classmethod
    def from_pem(cls, pem: bytes, kid: str | None = None) -> ClientKey:
        """A PEM private key (unencrypted): RSA (RS384, at least 2048 bits) or P-384 (ES384);
        `kid` None: the public key's RFC 7638 thumbprint."""
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError):
            raise SmartAuthError("the client key is not an unencrypted PEM private key") from None
        if isinstance(key, rsa.RSAPrivateKey):
            if key.key_size < 2048:
                raise SmartAuthError("the client's RSA key is shorter than 2048 bits")
            algorithm = "RS384"
        elif isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP384R1):
            algorithm = "ES384"
        else:
            raise SmartAuthError("the client key is neither RSA nor EC P-384 (RS384 / ES384)")
        made = cls(key, algorithm, "")
        return cls(key, algorithm, kid or made.thumbprint())

    @classmethod
    def load(cls, path: Path | None, environ: dict[str, str], kid: str | None) -> ClientKey:
        """The key of the PEM file `path`, else of the `MEDTPE_FHIR_CLIENT_KEY` variable."""
        if path is not None:
            return cls.from_pem(Path(path).read_bytes(), kid)
        text = environ.get(KEY_ENV)
        if not text:
            raise SmartAuthError(f"no client key: give --client-key FILE or set {KEY_ENV}")
        return cls.from_pem(text.encode(), kid)

    def public_jwk(self) -> dict[str, Any]:
        """The public key as a JWK (with `kid`, `alg`, `use`)."""
        public = self.key.public_key()
        algorithm = RSAAlgorithm if self.algorithm == "RS384" else ECAlgorithm
        jwk = json.loads(algorithm.to_jwk(public))
        return jwk | {"kid": self.kid, "alg": self.algorithm, "use": "sig"}

    def thumbprint(self) -> str:
        """The public key's RFC 7638 JWK thumbprint (SHA-256)."""
        jwk = self.public_jwk()
        members = ("e", "kty", "n") if jwk["kty"] == "RSA" else ("crv", "kty", "x", "y")
        canonical = json.dumps({m: jwk[m] for m in members}, separators=(",", ":"))
        return _b64(hashlib.sha256(canonical.encode()).digest())

    def assertion(self, client_id: str, token_url: str) -> str:
        """A client assertion for one token request."""
        now = int(time.time())
        claims = {
            "iss": client_id,
            "sub": client_id,
            "aud": token_url,
            "exp": now + ASSERTION_LIFETIME_S,
            "iat": now,
            "jti": str(uuid.uuid4()),
        }
        headers = {"kid": self.kid, "typ": "JWT"}
        return jwt.encode(claims, self.key, algorithm=self.algorithm, headers=headers)


def public_jwks(*keys: ClientKey) -> dict[str, Any]:
    """The JWK Set of the clients' public keys, as the EHR registers it."""
    return {"keys": [key.public_jwk() for key in keys]}


@dataclass
class SmartBackendAuth:
    """Access tokens for one client at one FHIR server."""

    fhir_base: str
    client_id: str
    key: ClientKey = field(repr=False)
    client: httpx.Client = field(repr=False)
    scope: str = DEFAULT_SCOPE
    settings: HttpSettings = field(default_factory=HttpSettings)
    token_url: str | None = None
    """The token endpoint (None: discovered from the server's SMART configuration)."""
    _token: str | None = field(default=None, repr=False)
    _expires_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def discover(self) -> str:
        """The token endpoint named by `[base]/.well-known/smart-configuration`, checked: HTTPS
        (or loopback), `private_key_jwt` and our algorithm offered when the server lists them."""
        if self.token_url is not None:
            return self.token_url
        url = f"{self.fhir_base.rstrip('/')}/{CONFIGURATION_PATH}"
        request = httpx.Request("GET", url, headers={"Accept": "application/json"})
        reply = fetch(self.client, request, self.settings, "SMART configuration")
        if reply.status != 200:
            raise SmartAuthError(f"{url}: HTTP {reply.status}: {reply.explanation()}")
        document = reply.json()
        token_url = document.get("token_endpoint") if isinstance(document, dict) else None
        if not isinstance(token_url, str):
            raise SmartAuthError(f"{url} names no token_endpoint")
        check_secure(token_url, "the token endpoint")
        methods = document.get("token_endpoint_auth_methods_supported")
        if isinstance(methods, list) and "private_key_jwt" not in methods:
            raise SmartAuthError(f"{url}: the server does not offer private_key_jwt")
        algorithms = document.get("token_endpoint_auth_signing_alg_values_supported")
        if isinstance(algorithms, list) and self.key.algorithm not in algorithms:
            raise SmartAuthError(
                f"{url}: the server takes {', '.join(map(str, algorithms))} assertions, "
                f"not {self.key.algorithm}"
            )
        self.token_url = token_url
        return token_url

    def token(self) -> str:
        """A valid access token (fetched when none is kept or it expires within a minute)."""
        with self._lock:
            if self._token is None or time.time() > self._expires_at - EXPIRY_MARGIN_S:
                self._fetch()
            assert self._token is not None
            return self._token

    def refresh(self) -> str:
        """A new access token (after the server refused the kept one)."""
        with self._lock:
            self._token = None
            self._fetch()
            assert self._token is not None
            return self._token

    def _fetch(self) -> None:
        token_url = self.discover()
        form = {
            "grant_type": "client_credentials",
            "scope": self.scope,
            "client_assertion_type": ASSERTION_TYPE,
            "client_assertion": self.key.assertion(self.client_id, token_url),
        }
        request = httpx.Request(
            "POST",
            token_url,
            content=urlencode(form).encode(),
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
        )
        reply = fetch(self.client, request, self.settings, "token request")
        if reply.status != 200:
            raise SmartAuthError(
                f"the token endpoint refused client {self.client_id!r}: HTTP {reply.status}: "
                f"{reply.explanation()}"
            )
        body = reply.json()
        token = body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise SmartAuthError("the token endpoint answered no access_token")
        lifetime = body.get("expires_in", DEFAULT_TOKEN_LIFETIME_S)
        if not isinstance(lifetime, int | float):
            lifetime = DEFAULT_TOKEN_LIFETIME_S
        self._token, self._expires_at = token, time.time() + float(lifetime)
