"""The shared state's two backends (medtpe/service/cds_hooks/state_store.py): the in-process store
and a real redis-server, which is stopped and started again to show what an outage does and how long
it costs; the score cache's entries authenticated (a forged, altered, moved or replayed entry is a
miss)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest

from medtpe.core.cds.cards import Score
from medtpe.service.cds_hooks.state_store import (
    MAC_BYTES,
    STATE_DEADLINE_S,
    LocalStore,
    RedisStore,
    ScoreStore,
    StateUnavailable,
    score_key,
    state_key,
)
from tests.support.redis_server import RedisServer

T = TypeVar("T")
KEY = b"k" * 32
"""The MAC key of the score caches here."""
SCORE = Score(
    task_title="ICU mortality",
    question="Will the patient die?",
    p_yes=0.75,
    prediction_time=datetime(2150, 3, 2, 8, 0),  # naive, as a record's times are
    events_total=31,
    events_kept=30,
    first_event=datetime(2150, 3, 1, 8, 0),
    last_event=None,
    input_budget=1024,
    original_tokens=900,
    medtpe_tokens=600,
    compression_rate=1 / 3,
    model="m",
    mode="medtpe",
    artefact_id="a1",
    computed_at=datetime(2026, 11, 27, 10, 0, 5, 123456, tzinfo=UTC),
    mapping={"resources": 40, "mapped": 31, "unmapped": 2, "skipped": 7},
)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """The coroutine's result, on a fresh event loop."""
    return asyncio.run(coroutine)


def test_the_local_store_claims_once_until_expiry_and_bounds_its_values() -> None:
    now = [0.0]
    store = LocalStore(max_values=2, clock=lambda: now[0])

    async def scenario() -> None:
        assert await store.claim("j", 10) and not await store.claim("j", 10)
        await store.put({"a": b"A"}, 10)
        await store.put({"b": b"B"}, 10)
        assert await store.get("a") == b"A"  # now the most recently used
        await store.put({"c": b"C"}, 10)
        assert [await store.get(k) for k in "abc"] == [b"A", None, b"C"]
        assert store.held_keys() == ["a", "c"]
        now[0] = 10.5
        assert await store.get("a") is None and len(store) == 1
        assert await store.claim("j", 10)  # expired: a new claim
        store.clear()
        assert len(store) == 0 and not await store.claim("j", 10)  # claims outlive clear()

    run(scenario())
    off = LocalStore(max_values=0)
    run(off.put({"a": b"A"}, 10))
    assert run(off.get("a")) is None and run(off.claim("j", 1))


def test_keys_are_namespaced_and_hold_no_identifier_in_clear() -> None:
    key = state_key("jti", "https://ehr.example", "token-id-1")
    prefix, kind, issuer, jti = key.split(":")
    assert (prefix, kind) == ("medtpe", "jti") and len(issuer) == len(jti) == 64
    assert "ehr" not in key and "token" not in key
    assert key != state_key("jti", "https://ehr.example", "token-id-2")


@pytest.mark.parametrize("backend", ["local", "redis"])
def test_a_score_comes_back_equal_from_either_store(
    backend: str, request: pytest.FixtureRequest
) -> None:
    if backend == "local":
        store: LocalStore | RedisStore = LocalStore(10)
    else:
        store = RedisStore(request.getfixturevalue("redis_server").url)
    scores = ScoreStore(store, KEY, ttl_s=60)

    async def scenario() -> tuple[Score | None, ...]:
        await scores.put(SCORE, ("issuer", "tenant", backend), ("issuer", "tenant", "second"))
        found = (
            await scores.get("issuer", "tenant", backend),
            await scores.get("issuer", "tenant", "second"),
            await scores.get("issuer", "other-tenant", backend),
            await ScoreStore(store, KEY, 60, enabled=False).get("issuer", "tenant", backend),
        )
        if isinstance(store, RedisStore):
            await store.aclose()
        return found

    kept, second, other, disabled = run(scenario())
    assert kept == second == SCORE and kept.computed_at.tzinfo is not None
    assert other is None and disabled is None


def forged(entry: bytes, p_yes: float, mac_key: bytes | None, name: str = "") -> bytes:
    """`entry` with its score's p("yes") changed: without a MAC (`mac_key` None, the MAC
    replaced by zeros), or with a MAC made with `mac_key` over the store key `name`."""
    payload = json.loads(entry[MAC_BYTES:])
    payload["score"]["p_yes"] = p_yes
    text = json.dumps(payload).encode()
    if mac_key is None:
        return b"0" * MAC_BYTES + text
    mac = hmac.new(mac_key, name.encode() + b"\x00" + text, hashlib.sha256).hexdigest()
    return mac.encode() + text


@pytest.mark.parametrize("backend", ["local", "redis"])
@pytest.mark.parametrize("attack", ["no_mac", "altered", "other_key", "moved", "raw_json"])
def test_an_entry_the_service_did_not_write_is_a_counted_miss(
    backend: str, attack: str, request: pytest.FixtureRequest
) -> None:
    """Written straight into the store: a forged score (JSON alone, or after a MAC of zeros), the
    service's entry with its probability changed (its MAC kept), one MACed with another key, the
    entry of another record moved under this record's key. Each is a miss counted
    `unauthenticated`; the service's own entry is a hit."""
    if backend == "local":
        store: LocalStore | RedisStore = LocalStore(10)
    else:
        store = RedisStore(request.getfixturevalue("redis_server").url)
    refused: list[str] = []
    scores = ScoreStore(store, KEY, ttl_s=60, on_rejected=refused.append)
    here, there = ("issuer", "tenant", attack, "record-1"), ("issuer", "tenant", attack, "record-2")

    async def scenario() -> tuple[Score | None, Score | None]:
        await scores.put(SCORE, here)
        await scores.put(replace(SCORE, p_yes=0.01), there)
        name, other = score_key(here), score_key(there)
        (entry, elsewhere) = await store.get_many([name, other])
        assert entry is not None and elsewhere is not None
        value = {
            "no_mac": forged(entry, 0.01, None),
            "altered": entry[:MAC_BYTES] + forged(entry, 0.01, None)[MAC_BYTES:],
            "other_key": forged(entry, 0.01, b"o" * 32, name),
            "moved": elsewhere,
            "raw_json": forged(entry, 0.01, None)[MAC_BYTES:],
        }[attack]
        await store.put({name: value}, 60)
        found = await scores.get(*here)
        await scores.put(SCORE, here)  # the service writes it again
        again = await scores.get(*here)
        if isinstance(store, RedisStore):
            await store.aclose()
        return found, again

    found, again = run(scenario())
    assert found is None and again == SCORE
    assert refused == ["unauthenticated"] and scores.rejected == {"unauthenticated": 1}


def test_an_older_entry_written_back_past_its_time_to_live_is_a_miss(
    redis_server: RedisServer,
) -> None:
    """The service's own entry, valid MAC, set again by someone with a new time to live once
    the service's has passed (a replay): its MAC covers when it expires, so it is refused."""
    now = [1_000_000.0]
    store = RedisStore(redis_server.url)
    scores = ScoreStore(store, KEY, ttl_s=60, clock=lambda: now[0])

    async def scenario() -> tuple[Score | None, Score | None]:
        await scores.put(SCORE, ("k", "replayed"))
        name = score_key(("k", "replayed"))
        entry = await store.get(name)
        assert entry is not None
        fresh = await scores.get("k", "replayed")
        now[0] += 61  # past the entry's time to live: the store dropped it, the attacker has it
        await store.put({name: entry}, 3600)
        replayed = await scores.get("k", "replayed")
        await store.aclose()
        return fresh, replayed

    fresh, replayed = run(scenario())
    assert fresh == SCORE and replayed is None and scores.rejected == {"expired": 1}


def test_one_jti_is_claimed_once_among_concurrent_clients(redis_server: RedisServer) -> None:
    """Two clients (two API processes' pools), 20 concurrent claims of one key: one wins."""
    stores = [RedisStore(redis_server.url), RedisStore(redis_server.url)]

    async def scenario() -> tuple[list[bool], bool, bool]:
        key = state_key("jti", "issuer", f"race-{time.time_ns()}")
        won = await asyncio.gather(*(stores[i % 2].claim(key, 0.3) for i in range(20)))
        again = await stores[0].claim(key, 0.3)
        await asyncio.sleep(0.4)  # the claim's time to live has passed
        after_expiry = await stores[1].claim(key, 0.3)
        for store in stores:
            await store.aclose()
        return list(won), again, after_expiry

    won, again, after_expiry = run(scenario())
    assert won.count(True) == 1 and not again and after_expiry


def test_a_stopped_store_fails_fast_once_logged_and_the_score_cache_goes_on(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore(redis_server.url)
    scores = ScoreStore(store, KEY, ttl_s=60)

    async def outage() -> float:
        assert await store.claim(state_key("jti", "i", "before"), 60)
        redis_server.stop()
        start = time.perf_counter()
        with pytest.raises(StateUnavailable):
            await store.claim(state_key("jti", "i", "during"), 60)
        assert await scores.get("k") is None  # a miss: the caller computes
        await scores.put(SCORE, ("k",))  # skipped, no error
        elapsed = time.perf_counter() - start
        await store.aclose()
        return elapsed

    with caplog.at_level(logging.INFO, logger="medtpe.service"):
        try:
            elapsed = run(outage())
        finally:
            redis_server.start()

        async def recovered() -> bool:
            claimed = await store.claim(state_key("jti", "i", "after"), 60)
            await store.aclose()
            return claimed

        assert run(recovered())
    assert elapsed < 3 * STATE_DEADLINE_S
    assert store.failures == {"claim": 1, "get": 1, "put": 1} and scores.skipped == 2
    messages = [r.getMessage() for r in caplog.records if r.name == "medtpe.service"]
    assert len([m for m in messages if "unavailable" in m]) == 1  # once per outage
    assert len([m for m in messages if "answers again" in m]) == 1


@pytest.fixture
def silent_store() -> Iterator[str]:
    """A TCP server on 127.0.0.1 that accepts connections and never answers (a hung store)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    listener.close()


def test_a_store_that_never_answers_costs_at_most_the_deadline(silent_store: str) -> None:
    store = RedisStore(silent_store)

    async def hung() -> float:
        start = time.perf_counter()
        with pytest.raises(StateUnavailable):
            await store.claim("medtpe:jti:x:y", 60)
        elapsed = time.perf_counter() - start
        await store.aclose()
        return elapsed

    assert run(hung()) < STATE_DEADLINE_S + 0.5
