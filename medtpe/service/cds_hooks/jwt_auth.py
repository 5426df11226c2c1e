"""The EHR's JWT on every CDS Hooks call (CDS Hooks 2.0.1, "Trusting CDS Clients"), checked with
PyJWT: no hand-written cryptography.

A call is accepted only when its `Authorization: Bearer` JWT
- names an allowed issuer (`iss`) whose JWK Set URL is configured, and any `jku` header is that
  URL (an allowlist of issuers and their JWKS, nothing fetched from a URL the token names);
- is signed with an asymmetric algorithm by a key of that set (`kid`); `none` and HMAC are
  refused whatever the key;
- carries `aud` equal to the URL called, `exp` in the future, `iat` not in the future and at most
  `max_lifetime_s` before `exp`, and a `jti` not seen before from that issuer (a replay cache
  holding each `jti` until its token expires, in the state every API process and replica shares:
  medtpe/service/cds_hooks/state_store.py).
Anything else is `HookUnauthorized`: a bare 401. The token, its claims and the reason never reach
a response; the reason is logged (without the token). A state store that does not answer makes
the call a 503 with `Retry-After`, never an unchecked accept.
"""

from __future__ import annotations

import asyncio
import logging
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

from medtpe.service.cds_hooks.fhir_fetch import ServerBase
from medtpe.service.cds_hooks.state_store import (
    LocalStore,
    StateStore,
    StateUnavailable,
    state_key,
    state_unavailable,
)

logger = logging.getLogger("medtpe.service")

ALGORITHMS = ("ES384", "RS384", "ES256", "RS256", "ES512", "RS512", "PS256", "PS384", "PS512")
"""Signatures accepted: the asymmetric JWS algorithms (CDS Hooks recommends ES384 and RS384)."""
LEEWAY_S = 30.0
"""Clock skew allowed between the EHR and this service."""
JWKS_TTL_S = 300.0
"""How long a fetched JWK Set is used before it is fetched again."""
JWKS_RETRY_S = 10.0
"""Fetches of one issuer's set start at most this often, failed ones included (an unknown `kid`
refetches the set, for key rotation, within this limit)."""
JWKS_TIMEOUT_S = 5.0
"""Deadline of one JWK Set fetch."""
JWKS_GRACE_S = 3600.0
"""Default of `MEDTPE_CDS_JWKS_GRACE_S`: how long past its TTL the last good set still serves
while its host does not answer."""


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
    """Each issuer's JWK Set, fetched over HTTP(S) without blocking the event loop.

    A set is used `JWKS_TTL_S` after its fetch, then refetched in the background while it still
    serves. An outage of the JWK Set host costs one bounded wait, not one per call: one fetch at
    a time per issuer (concurrent callers that need it wait on that one), at most one attempt
    per `JWKS_RETRY_S` (failed ones included), and the last good set serves for `grace_s` past
    its TTL. Only a caller that has no usable set, or names a `kid` absent from it, waits, and
    at most `timeout_s`.
    """

    def __init__(
        self,
        grace_s: float = JWKS_GRACE_S,
        timeout_s: float = JWKS_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grace_s = grace_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._sets: dict[str, tuple[float, jwt.PyJWKSet]] = {}
        self._attempted: dict[str, float] = {}
        self._failure: dict[str, str] = {}
        self._fetches: dict[str, asyncio.Task[None]] = {}

    async def key(self, url: str, kid: str) -> jwt.PyJWK:
        """The key `kid` of the set at `url` (refetched when absent: keys rotate)."""
        keys, age = self._usable(url)
        if keys is not None and kid in _kids(keys):
            if age >= JWKS_TTL_S:
                self._fetch(url)  # in the background: the last good set serves meanwhile
            return keys[kid]
        fetch = self._fetch(url)
        if fetch is not None:
            await asyncio.shield(fetch)
            keys, _ = self._usable(url)
        if keys is None:
            raise HookUnauthorized(f"jwks_unavailable:{self._failure.get(url, 'not_fetched')}")
        try:
            return keys[kid]
        except KeyError:
            raise HookUnauthorized("unknown_key") from None

    def _usable(self, url: str) -> tuple[jwt.PyJWKSet | None, float]:
        """The last good set and its age, None past its TTL and grace."""
        cached = self._sets.get(url)
        if cached is None:
            return None, float("inf")
        age = self._clock() - cached[0]
        return (cached[1] if age < JWKS_TTL_S + self.grace_s else None), age

    def _fetch(self, url: str) -> asyncio.Task[None] | None:
        """The fetch of `url` in flight, else a new one unless one started less than
        `JWKS_RETRY_S` ago (None)."""
        running = self._fetches.get(url)
        if running is not None:
            return running
        now = self._clock()
        if now - self._attempted.get(url, -JWKS_RETRY_S) < JWKS_RETRY_S:
            return None
        self._attempted[url] = now
        task = self._fetches[url] = asyncio.create_task(self._fetched(url))
        return task

    async def _fetched(self, url: str) -> None:
        """Fetch the set; a failure keeps the last good one (its reason kept for the log)."""
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                answer = await client.get(url)
            answer.raise_for_status()
            keys = jwt.PyJWKSet.from_dict(answer.json())
        except (httpx.HTTPError, ValueError, jwt.PyJWKSetError) as exc:
            self._failure[url] = type(exc).__name__
            logger.warning("JWK Set %s not fetched: %s", url, type(exc).__name__)
        else:
            self._sets[url] = (self._clock(), keys)
            self._failure.pop(url, None)
        finally:
            del self._fetches[url]


def _kids(keys: jwt.PyJWKSet) -> set[str]:
    return {key.key_id for key in keys.keys if key.key_id is not None}


class ReplayCache:
    """The `jti`s seen per issuer, each kept in the state store until its token's expiry (and
    the clock-skew leeway): the first use of a `jti` wins, in any process sharing the store."""

    def __init__(self, store: StateStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._clock = clock

    async def first_use(self, issuer: str, jti: str, expires: float) -> bool:
        """Record the token; False when it was seen before (a replay). `StateUnavailable`
        when the store does not answer."""
        ttl_s = max(expires + LEEWAY_S - self._clock(), 1.0)
        return await self.store.claim(state_key("jti", issuer, jti), ttl_s)


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
        self.replays = replays or ReplayCache(LocalStore(0))

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
        try:
            first = await self.replays.first_use(claims["iss"], claims["jti"], float(claims["exp"]))
        except StateUnavailable:
            raise state_unavailable("the replay check's state store did not answer") from None
        if not first:
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
