"""The EHR's JWT on every CDS Hooks call (CDS Hooks 2.0.1, "Trusting CDS Clients"), checked with
PyJWT: no hand-written cryptography.

A call is accepted only when its `Authorization: Bearer` JWT
- names an allowed issuer (`iss`) whose JWK Set URL is configured, and any `jku` header is that
  URL (an allowlist of issuers and their JWKS, nothing fetched from a URL the token names);
- is signed with an asymmetric algorithm by a key of that set (`kid`); `none` and HMAC are
  refused whatever the key;
- carries `aud` equal to the URL called, `exp` in the future, `iat` not in the future and at most
  `max_lifetime_s` before `exp`, and a `jti` not seen before from that issuer (a replay cache
  holding each `jti` until its token expires).
Anything else is `HookUnauthorized`: a bare 401. The token, its claims and the reason never reach
a response; the reason is logged (without the token).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import jwt
from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from service.cds_hooks.fhir_fetch import ServerBase

ALGORITHMS = ("ES384", "RS384", "ES256", "RS256", "ES512", "RS512", "PS256", "PS384", "PS512")
"""Signatures accepted: the asymmetric JWS algorithms (CDS Hooks recommends ES384 and RS384)."""
LEEWAY_S = 30.0
"""Clock skew allowed between the EHR and this service."""
JWKS_TTL_S = 300.0
"""How long a fetched JWK Set is used before it is fetched again."""
JWKS_REFRESH_S = 30.0
"""An unknown `kid` refetches the set (key rotation), at most this often per issuer."""
JWKS_TIMEOUT_S = 5.0


ANY_FHIR_SERVER = "*"
"""An issuer's `fhir_servers` when its calls may name any FHIR server (unsafe: a caller holding
its key can point the service's fetches at any host the service reaches)."""


class CdsIssuer(BaseModel):
    """An EHR allowed to call the hooks: where its public keys are, and which FHIR servers it
    may send the service to (required: base URLs, or `"*"` for any)."""

    model_config = ConfigDict(extra="forbid")

    jwks_url: AnyHttpUrl = Field(description="The issuer's JWK Set URL.")
    fhir_servers: list[AnyHttpUrl] | Literal["*"] = Field(
        description="Base URLs of the FHIR servers its calls may name in `fhirServer` (at least "
        'one; every fetch of a call stays under the one it names), or `"*"`: any (unsafe).',
    )

    @model_validator(mode="before")
    @classmethod
    def _fhir_servers_named(cls, data: Any) -> Any:
        """Refuse an issuer without `fhir_servers` (its callers could send the service, with
        their token, to any host); `["*"]` is `"*"`."""
        if isinstance(data, dict):
            servers = data.get("fhir_servers")
            if servers == [ANY_FHIR_SERVER]:
                return data | {"fhir_servers": ANY_FHIR_SERVER}
            if not servers:
                raise ValueError(
                    'MEDTPE_CDS_ISSUERS: this issuer needs "fhir_servers": the base URLs of the '
                    'FHIR servers its calls may name, or "*" for any (unsafe)'
                )
        return data

    @field_validator("fhir_servers")
    @classmethod
    def _base_urls(cls, value: list[AnyHttpUrl] | str) -> list[AnyHttpUrl] | str:
        """Each a FHIR base URL as fetches are compared with it (`ServerBase`)."""
        for url in value if isinstance(value, list) else ():
            ServerBase.of(str(url))
        return value


class HookUnauthorized(Exception):
    """The call's JWT is missing or not acceptable; `reason` is for the log only."""

    def __init__(self, reason: str, jti: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.jti = jti


@dataclass(frozen=True)
class Caller:
    """The authenticated CDS client of one call."""

    issuer: str
    tenant: str | None
    jti: str
    config: CdsIssuer


class JwksCache:
    """Each issuer's JWK Set, fetched over HTTP(S) without blocking the event loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._sets: dict[str, tuple[float, jwt.PyJWKSet]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def key(self, url: str, kid: str) -> jwt.PyJWK:
        """The key `kid` of the set at `url` (refetched once when absent: keys rotate)."""
        keys = await self._keys(url, max_age_s=JWKS_TTL_S)
        if kid not in _kids(keys):
            keys = await self._keys(url, max_age_s=JWKS_REFRESH_S)
        try:
            return keys[kid]
        except KeyError:
            raise HookUnauthorized("unknown_key") from None

    async def _keys(self, url: str, max_age_s: float) -> jwt.PyJWKSet:
        lock = self._locks.setdefault(url, asyncio.Lock())
        async with lock:
            cached = self._sets.get(url)
            if cached is not None and self._clock() - cached[0] < max_age_s:
                return cached[1]
            try:
                async with httpx.AsyncClient(timeout=JWKS_TIMEOUT_S) as client:
                    answer = await client.get(url)
                answer.raise_for_status()
                keys = jwt.PyJWKSet.from_dict(answer.json())
            except (httpx.HTTPError, ValueError, jwt.PyJWKSetError) as exc:
                if cached is not None:  # keep serving the last good set
                    return cached[1]
                raise HookUnauthorized(f"jwks_unavailable:{type(exc).__name__}") from exc
            self._sets[url] = (self._clock(), keys)
            return keys


def _kids(keys: jwt.PyJWKSet) -> set[str]:
    return {key.key_id for key in keys.keys if key.key_id is not None}


class ReplayCache:
    """The `jti`s seen per issuer, each kept until its token's expiry."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._seen: dict[tuple[str, str], float] = {}

    def first_use(self, issuer: str, jti: str, expires: float) -> bool:
        """Record the token; False when it was seen before (a replay)."""
        now = self._clock()
        if len(self._seen) > 1024:
            self._seen = {k: exp for k, exp in self._seen.items() if exp + LEEWAY_S >= now}
        key = (issuer, jti)
        if key in self._seen:
            return False
        self._seen[key] = expires
        return True


class HookAuthenticator:
    """Verifies the JWT of each call against the allowed issuers."""

    def __init__(
        self,
        issuers: Mapping[str, CdsIssuer],
        max_lifetime_s: float,
        jwks: JwksCache | None = None,
        replays: ReplayCache | None = None,
    ) -> None:
        self.issuers = dict(issuers)
        self.max_lifetime_s = max_lifetime_s
        self.jwks = jwks or JwksCache()
        self.replays = replays or ReplayCache()

    async def verify(self, authorization: str | None, audience: str) -> Caller:
        """The caller of a call with this `Authorization` header to the URL `audience`."""
        if not authorization or not authorization.lower().startswith("bearer "):
            raise HookUnauthorized("no_bearer_token")
        token = authorization[7:].strip()
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.InvalidTokenError:
            raise HookUnauthorized("malformed_token") from None
        jti = unverified.get("jti") if isinstance(unverified.get("jti"), str) else None
        config = self._issuer(header, unverified, jti)
        key = await self.jwks.key(str(config.jwks_url), header["kid"])
        claims = self._claims(token, key, header["alg"], audience, unverified["iss"], jti)
        if not self.replays.first_use(claims["iss"], claims["jti"], float(claims["exp"])):
            raise HookUnauthorized("replayed_jti", jti)
        tenant = claims.get("tenant")
        return Caller(
            claims["iss"], tenant if isinstance(tenant, str) else None, claims["jti"], config
        )

    def _issuer(self, header: dict[str, Any], claims: dict[str, Any], jti: str | None) -> CdsIssuer:
        """The allowed issuer the token names, its header checked (alg, typ, kid, jku)."""
        if header.get("alg") not in ALGORITHMS:
            raise HookUnauthorized("algorithm_not_allowed", jti)
        if header.get("typ") != "JWT" or not isinstance(header.get("kid"), str):
            raise HookUnauthorized("header_typ_or_kid", jti)
        config = self.issuers.get(claims.get("iss")) if isinstance(claims.get("iss"), str) else None
        if config is None:
            raise HookUnauthorized("issuer_not_allowed", jti)
        jku = header.get("jku")
        if jku is not None and jku != str(config.jwks_url):
            raise HookUnauthorized("jku_not_allowed", jti)
        return config

    def _claims(
        self, token: str, key: jwt.PyJWK, alg: str, audience: str, issuer: str, jti: str | None
    ) -> dict[str, Any]:
        """The verified claims: signature, `aud`, `iss`, `exp`, `iat`, `jti`, lifetime."""
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=audience,
                issuer=issuer,
                leeway=LEEWAY_S,
                options={"require": ["iss", "aud", "exp", "iat", "jti"], "strict_aud": False},
            )
        except jwt.InvalidTokenError as exc:
            raise HookUnauthorized(f"invalid:{type(exc).__name__}", jti) from None
        if not isinstance(claims["jti"], str) or not claims["jti"]:
            raise HookUnauthorized("invalid:jti", jti)
        if float(claims["exp"]) - float(claims["iat"]) > self.max_lifetime_s:
            raise HookUnauthorized("lifetime_too_long", jti)
        return claims
