"""An issuer's JWK Set host that goes down costs one bounded wait, not one per call
(service/cds_hooks/jwt_auth.py, `JwksCache`): a real JWK Set server on 127.0.0.1 that answers,
then hangs past the fetch timeout; the calls go through the JWT check with real tokens."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from service.cds_hooks.jwt_auth import (
    JWKS_RETRY_S,
    JWKS_TTL_S,
    CdsIssuer,
    HookAuthenticator,
    HookUnauthorized,
    JwksCache,
)
from tests.support.ehr import Ehr

AUDIENCE = "http://testserver/cds-services/x"
TIMEOUT_S = 0.5
"""The fetch timeout of these tests' caches (the service's is `JWKS_TIMEOUT_S`)."""
HANG_S = 2.0
"""How long the server hangs on a request while down (past `TIMEOUT_S`)."""
N_CALLS = 10


@dataclass
class JwksHost:
    """A JWK Set server: `up` answers the set, else each request hangs `HANG_S`; `requests`
    counts the requests it received."""

    ehr: Ehr
    up: bool = True
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def host() -> Iterator[JwksHost]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    served = JwksHost(Ehr(jwks_url=f"http://127.0.0.1:{server.server_address[1]}/jwks"))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with served.lock:
                served.requests += 1
            if not served.up:
                time.sleep(HANG_S)
                self.send_response(503)
                self.end_headers()
                return
            body = json.dumps(served.ehr.jwks()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server.RequestHandlerClass = Handler
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served
    server.shutdown()
    server.server_close()


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


async def outcome(auth: HookAuthenticator, host: JwksHost, **headers: str) -> str:
    """`ok`, or the reason the call's JWT was refused."""
    token = host.ehr.token(AUDIENCE, headers=headers or None)
    try:
        await auth.verify(f"Bearer {token}", AUDIENCE)
    except HookUnauthorized as exc:
        return exc.reason
    return "ok"


async def timed_calls(auth: HookAuthenticator, host: JwksHost) -> tuple[list[str], float]:
    """`N_CALLS` calls, half at once and half one after the other: outcomes and seconds."""
    start = time.perf_counter()
    half = N_CALLS // 2
    outcomes = list(await asyncio.gather(*(outcome(auth, host) for _ in range(half))))
    outcomes += [await outcome(auth, host) for _ in range(N_CALLS - half)]
    return outcomes, time.perf_counter() - start


def test_a_host_down_from_the_start_costs_one_wait(host: JwksHost) -> None:
    host.up = False
    clock = Clock()
    auth = authenticator(host, clock)

    async def scenario() -> tuple[list[str], float, list[str]]:
        outcomes, elapsed = await timed_calls(auth, host)
        host.up = True
        clock.now += JWKS_RETRY_S  # the next attempt is allowed: the host answers now
        return outcomes, elapsed, [await outcome(auth, host)]

    outcomes, elapsed, recovered = asyncio.run(scenario())
    assert all(o.startswith("jwks_unavailable") for o in outcomes), outcomes
    assert elapsed < 2 * TIMEOUT_S  # one wait for all, not one per call (10 x 0.5 s)
    assert host.requests == 2  # one attempt during the outage, one after the retry interval
    assert recovered == ["ok"]


def test_the_last_good_set_serves_without_waiting_through_an_outage(host: JwksHost) -> None:
    clock = Clock()
    auth = authenticator(host, clock, grace_s=60.0)

    async def scenario() -> tuple[list[str], float, str, list[str]]:
        assert await outcome(auth, host) == "ok"
        host.up = False
        clock.now += JWKS_TTL_S + 1  # the set is due for a refetch, which hangs
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
    assert host.requests <= 3  # the first fetch, the refetch in the outage, one past the grace
