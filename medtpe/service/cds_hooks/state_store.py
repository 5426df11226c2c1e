"""State that every API process and replica of an instance must see alike: the CDS Hooks replay
cache (each `jti` accepted once), score cache and issued cards (`IssuedCards`: feedback is
taken for those only), behind one small async interface (`StateStore`) with two backends.

- `LocalStore` (`MEDTPE_STATE_URL` unset): this process's memory. Right for one API process;
  an instance with several (`MEDTPE_API_WORKERS` > 1) and CDS issuers refuses to start without a
  state URL (medtpe/service/settings.py), since each process would accept a token once.
- `RedisStore` (`MEDTPE_STATE_URL=redis://host:port/db`): a Redis or Valkey server shared by
  every process and replica, through redis-py's asyncio client. A `jti` is claimed with one
  atomic `SET key 1 NX PX ttl`: the first writer wins, every later one is refused.

Keys are namespaced and hashed (`state_key`: `medtpe:jti:{sha256(issuer)}:{sha256(jti)}`,
`medtpe:score:{sha256(...)}`, `medtpe:card:{sha256(...)}`), so no issuer, token or patient
identifier is stored in clear.
A score's entry carries its MAC (HMAC-SHA256, keyed by `MEDTPE_STATE_KEY`, over the store key
and the entry's JSON bytes, which say when it expires): an entry the service did not write
under that key, or past its time to live, is a miss (`ScoreStore`), never a card.
Every Redis operation is bounded: connect and read timeouts of `STATE_TIMEOUT_S`, no retry, the
whole operation within `STATE_DEADLINE_S`. A store that cannot answer raises `StateUnavailable`
(logged once per outage, failures counted per operation): the replay check then fails closed
(503 with `Retry-After`), the score cache degrades to recomputing (`ScoreStore`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import msgspec
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from medtpe.core.cds.cards import Score
from medtpe.core.secret_masking import mask_secrets
from medtpe.service.plumbing.errors import ApiError

logger = logging.getLogger("medtpe.service")

T = TypeVar("T")

KEY_PREFIX = "medtpe"
STATE_TIMEOUT_S = 0.5
"""Connect and read timeout of each Redis socket operation."""
STATE_DEADLINE_S = 1.0
"""Longest wait on the store for one operation (connect and answer together)."""
STATE_RETRY_AFTER_S = 5
"""`Retry-After` of a hook call refused because the store did not answer."""
STATE_URL_SCHEMES = ("redis", "rediss", "unix")


class StateUnavailable(Exception):
    """The state store did not answer in time (or refused the operation)."""


def state_unavailable(detail: str) -> ApiError:
    """The 503 of a call that needed the store when it did not answer (`Retry-After`)."""
    retry = {"Retry-After": str(STATE_RETRY_AFTER_S)}
    return ApiError(503, "state_unavailable", f"{detail}; try again later", headers=retry)


class StateStore(Protocol):
    """Keys with a time to live, shared by whoever uses the same store."""

    async def claim(self, key: str, ttl_s: float) -> bool:
        """Record `key` for `ttl_s` seconds unless it exists: True for the first writer only."""
        ...

    async def get(self, key: str) -> bytes | None:
        """The live value under `key`, else None."""
        ...

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The live value under each of `keys` (None where there is none; one round trip)."""
        ...

    async def put(self, values: Mapping[str, bytes], ttl_s: float) -> None:
        """Store each of `values` under its key for `ttl_s` seconds (one round trip)."""
        ...

    async def aclose(self) -> None:
        """Release connections (at shutdown)."""
        ...


def state_key(kind: str, *parts: str) -> str:
    """The store's key of `parts` in namespace `kind`: each part as its SHA-256 (hex).

    >>> state_key("jti", "https://ehr", "j1").count(":"), len(state_key("score", "x"))
    (3, 77)
    """
    hashed = (hashlib.sha256(part.encode()).hexdigest() for part in parts)
    return ":".join((KEY_PREFIX, kind, *hashed))


class LocalStore:
    """The store in this process's memory: claims until they expire, and at most `max_values`
    values (the least recently used dropped first)."""

    PURGE_EVERY = 1024
    """Expired claims are swept when this many more are held."""

    def __init__(self, max_values: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_values = max_values
        self._clock = clock
        self._claims: dict[str, float] = {}
        self._purge_at = self.PURGE_EVERY
        self._values: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._values)

    async def claim(self, key: str, ttl_s: float) -> bool:
        """Record `key` unless it is held and live."""
        now = self._clock()
        if len(self._claims) >= self._purge_at:
            self._claims = {k: until for k, until in self._claims.items() if until > now}
            self._purge_at = len(self._claims) + self.PURGE_EVERY
        until = self._claims.get(key)
        if until is not None and until > now:
            return False
        self._claims[key] = now + ttl_s
        return True

    async def get(self, key: str) -> bytes | None:
        """The live value (now the most recently used), else None."""
        entry = self._values.get(key)
        if entry is None:
            return None
        until, value = entry
        if self._clock() >= until:
            del self._values[key]
            return None
        self._values.move_to_end(key)
        return value

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """`get` of each key."""
        return [await self.get(key) for key in keys]

    async def put(self, values: Mapping[str, bytes], ttl_s: float) -> None:
        """Store each value under its key, dropping the least recently used beyond
        `max_values`."""
        if self.max_values <= 0:
            return
        for key, value in values.items():
            self._values[key] = (self._clock() + ttl_s, value)
            self._values.move_to_end(key)
        while len(self._values) > self.max_values:
            self._values.popitem(last=False)

    def held_keys(self) -> list[str]:
        """The keys of the values held (as `KEYS medtpe:*` lists a Redis server's), least
        recently used first."""
        return list(self._values)

    def clear(self) -> None:
        """Forget every value (the claims stay: a `jti` seen stays refused)."""
        self._values.clear()

    async def aclose(self) -> None:
        """Nothing to release."""


class RedisStore:
    """The store on a Redis or Valkey server: one connection pool per event loop."""

    def __init__(
        self,
        url: str,
        timeout_s: float = STATE_TIMEOUT_S,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.deadline_s = max(STATE_DEADLINE_S, 2 * timeout_s)
        self.failures: Counter[str] = Counter()
        """Operations that failed, by operation (`claim`, `get`, `put`)."""
        self.on_failure = on_failure
        """Told the operation of each failure (the service counts them in `/metrics`)."""
        self._clients: dict[asyncio.AbstractEventLoop, Redis] = {}
        self._down_since: float | None = None

    def _client(self) -> Redis:
        """This event loop's client (a loop's connections cannot serve another loop)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            for old in [other for other in self._clients if other.is_closed()]:
                del self._clients[old]
            client = self._clients[loop] = Redis.from_url(
                self.url,
                socket_connect_timeout=self.timeout_s,
                socket_timeout=self.timeout_s,
                retry=Retry(NoBackoff(), 0),
            )
        return client

    async def claim(self, key: str, ttl_s: float) -> bool:
        """`SET key 1 NX PX ttl`: atomic, the first writer wins."""
        won = await self._run("claim", lambda c: c.set(key, b"1", nx=True, px=_ms(ttl_s)))
        return bool(won)

    async def get(self, key: str) -> bytes | None:
        """`GET key`."""
        return await self._run("get", lambda c: c.get(key))

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """`MGET keys`."""
        return await self._run("get", lambda c: c.mget(list(keys)))

    async def put(self, values: Mapping[str, bytes], ttl_s: float) -> None:
        """`SET key value PX ttl` for each key, pipelined: one round trip."""
        await self._run("put", lambda c: _set_all(c, values, _ms(ttl_s)))

    async def aclose(self) -> None:
        """Close this event loop's connections."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    async def _run(self, operation: str, command: Callable[[Redis], Awaitable[T]]) -> T:
        """One command within the deadline; a failure is `StateUnavailable` (the first of an
        outage logged, every one counted)."""
        try:
            async with asyncio.timeout(self.deadline_s):
                result = await command(self._client())
        except (RedisError, OSError, TimeoutError) as exc:
            self.failures[operation] += 1
            if self.on_failure is not None:
                self.on_failure(operation)
            if self._down_since is None:
                self._down_since = time.monotonic()
                logger.warning(
                    "state store %s unavailable (%s: %s): hook calls get 503, scores are "
                    "recomputed until it answers",
                    mask_secrets(self.url),
                    type(exc).__name__,
                    exc,
                )
            raise StateUnavailable(f"{operation}: {type(exc).__name__}") from exc
        if self._down_since is not None:
            logger.info(
                "state store %s answers again after %.1f s (failed operations so far: %s)",
                mask_secrets(self.url),
                time.monotonic() - self._down_since,
                dict(self.failures),
            )
            self._down_since = None
        return result


async def _set_all(client: Redis, values: Mapping[str, bytes], ttl_ms: int) -> None:
    """SET each key to its value (time to live `ttl_ms`) in one pipeline (not a
    transaction)."""
    async with client.pipeline(transaction=False) as pipe:
        for key, value in values.items():
            pipe.set(key, value, px=ttl_ms)
        await pipe.execute()


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def open_store(
    url: str | None, max_values: int, on_failure: Callable[[str], None] | None = None
) -> StateStore:
    """The store at `url` (None: this process's memory, at most `max_values` values, which
    never fails); `on_failure` is told the operation of each failure."""
    if url is None:
        return LocalStore(max_values)
    return RedisStore(url, on_failure=on_failure)


SCORE_FORMAT = "score-v3"
"""Part of every score key: a release that changes `Score` changes it, so replicas of two
releases side by side (a rolling update) never read each other's values."""


MAC_BYTES = 64
"""Length of an entry's MAC at its start: HMAC-SHA256 in hex."""


@dataclass(frozen=True)
class ScoreEntry:
    """What a score's entry holds after its MAC: the score and when it stops being served."""

    expires: float
    """Unix time (s) at which the entry's time to live ends."""
    score: Score


class ScoreStore:
    """The CDS score cache on a state store, each entry authenticated: `key` (bytes every API
    process and replica shares) keys an HMAC-SHA256 over the store key and the entry's JSON
    (`ScoreEntry`), kept at the entry's start. An entry without a valid MAC (written by anyone
    but the service, altered, or moved to another key) is a miss, `unauthenticated`; one with
    a valid MAC past its `expires` (an older entry written back) is a miss, `expired`; each told
    to `on_rejected`. Entries are kept `ttl_s` seconds; a store that fails makes a miss (get)
    or is skipped (put), and the call goes on. `enabled` False: nothing is kept. `clock`: Unix
    time."""

    def __init__(
        self,
        store: StateStore,
        key: bytes,
        ttl_s: float,
        enabled: bool = True,
        on_rejected: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.enabled = enabled
        self.on_rejected = on_rejected
        self.skipped = 0
        """Gets and puts the store failed (each call went on without the cache)."""
        self.rejected: Counter[str] = Counter()
        """Entries found and refused, by reason (`unauthenticated`, `expired`)."""
        self._key = key
        self._clock = clock

    async def get(self, *parts: str) -> Score | None:
        """The score kept under `parts` by this service, else None (also when the store fails
        or the entry is refused)."""
        if not self.enabled:
            return None
        name = score_key(parts)
        try:
            data = await self.store.get(name)
        except StateUnavailable:
            self.skipped += 1
            return None
        if data is None:
            return None
        payload = data[MAC_BYTES:]
        if not hmac.compare_digest(data[:MAC_BYTES], self._mac(name, payload)):
            return self._reject("unauthenticated")
        try:
            entry = msgspec.json.decode(payload, type=ScoreEntry)
        except msgspec.DecodeError:  # a `Score` changed without a new `SCORE_FORMAT`: a miss
            return None
        if entry.expires <= self._clock():
            return self._reject("expired")
        return entry.score

    async def put(self, score: Score, *keys: tuple[str, ...]) -> None:
        """Keep `score` under each of `keys` (each a tuple of parts), each entry with its MAC
        (one round trip; nothing when the store fails)."""
        if not self.enabled:
            return
        payload = msgspec.json.encode(ScoreEntry(self._clock() + self.ttl_s, score))
        names = [score_key(parts) for parts in keys]
        try:
            await self.store.put({n: self._mac(n, payload) + payload for n in names}, self.ttl_s)
        except StateUnavailable:
            self.skipped += 1

    def _mac(self, name: str, payload: bytes) -> bytes:
        """The MAC (hex) of an entry's JSON under the store key `name`."""
        message = name.encode() + b"\x00" + payload
        return hmac.new(self._key, message, hashlib.sha256).hexdigest().encode()

    def _reject(self, reason: str) -> None:
        """Count an entry refused for `reason` (a miss)."""
        self.rejected[reason] += 1
        if self.on_rejected is not None:
            self.on_rejected(reason)


def score_key(parts: tuple[str, ...]) -> str:
    """`medtpe:score:{sha256}` of the parts (unit-separated) and `SCORE_FORMAT`."""
    return state_key("score", "\x1f".join((SCORE_FORMAT, *parts)))


CARD_FORMAT = "card-v1"
"""Part of every issued card's key (as `SCORE_FORMAT` is of a score's)."""


class IssuedCards:
    """The cards this service issued, per caller and service, kept `ttl_s` seconds: feedback is
    taken for those only. A card is kept under one key (the SHA-256 of caller, card uuid and
    `CARD_FORMAT`) holding the service's id."""

    def __init__(self, store: StateStore, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s

    async def issue(self, caller: Sequence[str], service: str, card: str) -> None:
        """Keep `card` as issued to `caller` (its identifying parts) by `service`; a store that
        fails keeps nothing (its failure is counted by the store), and the card is answered:
        feedback on it will be refused."""
        with contextlib.suppress(StateUnavailable):
            await self.store.put({_card_key(caller, card): service.encode()}, self.ttl_s)

    async def unknown(self, caller: Sequence[str], service: str, cards: Sequence[str]) -> list[int]:
        """The indices of `cards` that `service` did not issue to `caller` (or whose time to
        live is over); one round trip. `StateUnavailable` when the store does not answer."""
        kept = await self.store.get_many([_card_key(caller, card) for card in cards])
        mine = service.encode()
        return [i for i, value in enumerate(kept) if value != mine]


def _card_key(caller: Sequence[str], card: str) -> str:
    """`medtpe:card:{sha256}` of the caller's parts, the card uuid and `CARD_FORMAT`."""
    return state_key("card", "\x1f".join((CARD_FORMAT, *caller, card)))
