"""An issuer's JWK Set host that goes down costs one bounded wait, not one per call
(medtpe/service/cds_hooks/jwt_auth.py, `JwksCache`): a real JWK Set server on 127.0.0.1 that
answers, then stalls past the fetch timeout; the calls go through the JWT check with real tokens."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from medtpe.service.cds_hooks.jwt_auth import (
    JWKS_RETRY_S,
    JWKS_TTL_S,
    CdsIssuer,
    HookAuthenticator,
    HookUnauthorized,
    JwksCache,
)
from tests.support.ehr import Ehr
from tests.support.hostile_fhir import Answer, HostileFhir, hostile_fhir

AUDIENCE = "http://testserver/cds-services/x"
TIMEOUT_S = 1.0
"""The fetch timeout of these tests' caches (the service's is `JWKS_TIMEOUT_S`)."""
HANG_S = 3.0
"""How long the host, while down, pauses in each answer (past `TIMEOUT_S`)."""
N_CALLS = 10


class JwksHost:
    """An EHR's JWK Set on a real HTTP server (tests/support/hostile_fhir.py) that can go down:
    then it sends the headers of each answer and stalls in its body. `requests`: how many it got
    since it last went up or down."""

    def __init__(self, server: HostileFhir) -> None:
        self.server = server
        self.ehr = Ehr(jwks_url=f"{server.origin}/jwks")
        self.up()

    def up(self) -> None:
        self.server.answer_all(Answer.json(self.ehr.jwks()))

    def down(self) -> None:
        self.server.answer_all(Answer(200, b" ", repeat=3, pause_s=HANG_S))

    @property
    def requests(self) -> int:
        return len(self.server.requests)


@pytest.fixture
def host() -> Iterator[JwksHost]:
    with hostile_fhir() as server:
        yield JwksHost(server)


class Clock:
    """A monotonic clock the test moves forward."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def authenticator(host: JwksHost, clock: Clock, grace_s: float = 60.0) -> HookAuthenticator:
    issuer = CdsIssuer.model_validate(
        {"jwks_url": host.ehr.jwks_url, "fhir_servers": ["http://127.0.0.1:9/fhir"]}
    )
    jwks = JwksCache(grace_s=grace_s, timeout_s=TIMEOUT_S, clock=clock)
    return HookAuthenticator({host.ehr.issuer: issuer}, 600.0, jwks=jwks)


async def outcome(
    auth: HookAuthenticator, host: JwksHost, token: str | None = None, **headers: str
) -> str:
    """`ok`, or the reason the call's JWT (`token`, else a new one) was refused."""
    token = token or host.ehr.token(AUDIENCE, headers=headers or None)
    try:
        await auth.verify(f"Bearer {token}", AUDIENCE)
    except HookUnauthorized as exc:
        return exc.reason
    return "ok"


async def timed_calls(auth: HookAuthenticator, host: JwksHost) -> tuple[list[str], float]:
    """`N_CALLS` calls, half at once and half one after the other: outcomes and seconds (the
    tokens signed before the clock starts)."""
    tokens = [host.ehr.token(AUDIENCE) for _ in range(N_CALLS)]
    half = N_CALLS // 2
    start = time.perf_counter()
    outcomes = list(await asyncio.gather(*(outcome(auth, host, t) for t in tokens[:half])))
    outcomes += [await outcome(auth, host, t) for t in tokens[half:]]
    return outcomes, time.perf_counter() - start


def test_a_host_down_from_the_start_costs_one_wait(host: JwksHost) -> None:
    host.down()
    clock = Clock()
    auth = authenticator(host, clock)

    async def scenario() -> tuple[list[str], float, int, list[str]]:
        outcomes, elapsed = await timed_calls(auth, host)
        attempts = host.requests
        host.up()
        clock.now += JWKS_RETRY_S  # the next attempt is allowed: the host answers now
        return outcomes, elapsed, attempts, [await outcome(auth, host)]

    outcomes, elapsed, attempts, recovered = asyncio.run(scenario())
    assert all(o.startswith("jwks_unavailable") for o in outcomes), outcomes
    assert elapsed < 2 * TIMEOUT_S  # one wait for all, not one per call (10 x 1 s)
    assert attempts == 1  # one attempt during the outage
    assert recovered == ["ok"]


def test_the_last_good_set_serves_without_waiting_through_an_outage(host: JwksHost) -> None:
    clock = Clock()
    auth = authenticator(host, clock, grace_s=60.0)

    async def scenario() -> tuple[list[str], float, str, list[str]]:
        assert await outcome(auth, host) == "ok"
        host.down()
        clock.now += JWKS_TTL_S + 1  # the set is due for a refetch, which stalls
        outcomes, elapsed = await timed_calls(auth, host)
        # a kid absent from the set waits on the refetch in flight (once), then is refused
        unknown = await outcome(auth, host, kid="rotated-key")
        clock.now += 60.0  # past the grace: the last good set no longer serves
        return outcomes, elapsed, unknown, [await outcome(auth, host)]

    outcomes, elapsed, unknown, expired = asyncio.run(scenario())
    assert outcomes == ["ok"] * N_CALLS
    assert elapsed < 2 * TIMEOUT_S
    assert unknown == "unknown_key"
    assert expired[0].startswith("jwks_unavailable")
    assert host.requests == 2  # during the outage: the refetch, then one past the grace
