"""The service's side of the prediction ledger: the ledger opened with the app (retried while it
cannot be, `/readyz` not ready meanwhile), each answer's row built
(`medtpe.ledger.answers.ReceiptBasis`) and committed before the answer leaves (fail closed: a row
that cannot be written is a 503 `ledger_unavailable` with `Retry-After`, and no answer), and who
asked (`caller_id`).

Every blocking call on the ledger (open, write, close) runs on the ledger's own small pool
(`LedgerPool`: `LEDGER_THREADS` threads, at most `LEDGER_QUEUE` calls waiting), never on the
event loop's default executor: a database that does not answer (a table locked by a migration or
an index build) holds at most those threads, each for at most the ledger's timeouts
(`MEDTPE_LEDGER_LOCK_TIMEOUT_S`, `MEDTPE_LEDGER_STATEMENT_TIMEOUT_S`), after which its answer is
a 503 `ledger_unavailable`; a write past the queue's bound is one at once. `/tokenize`,
`/readyz` and every door that writes nothing go on answering.

With `MEDTPE_LEDGER_OFF=true` (loopback only, `medtpe.service.settings`) nothing is recorded and
answers carry no `prediction_id` nor receipt."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from medtpe.core.answer_facts import AnswerFacts
from medtpe.core.secret_masking import mask_secrets
from medtpe.ledger.answers import ReceiptBasis
from medtpe.ledger.feedback import FeedbackRow, record_feedback
from medtpe.ledger.settings import LedgerSettings
from medtpe.ledger.signing import Signer
from medtpe.ledger.store import Ledger, LedgerUnavailable, PredictionRow
from medtpe.service.plumbing.errors import ApiError

logger = logging.getLogger("medtpe.service")

LEDGER_RETRY_AFTER_S = 5
"""`Retry-After` of a 503 `ledger_unavailable`: a database restart or fail-over."""
REOPEN_INTERVAL_S = 2.0
"""Least time between two attempts to open a ledger that could not be opened."""
CALLER_KEY_CHARS = 16
"""Hex digits of an API key's SHA-256 naming its caller (the key itself is never stored)."""
LEDGER_THREADS = 4
"""Threads of the ledger's own pool (`LedgerPool`)."""
LEDGER_QUEUE = 64
"""Ledger calls that may wait for one of its threads; one more is refused at once (a 503)."""

Result = TypeVar("Result")


class LedgerPoolFull(RuntimeError):
    """Every thread of the ledger's pool is busy and its queue is full."""


class LedgerPool:
    """The executor of the ledger's blocking calls: `threads` threads of its own, at most
    `threads` + `queue` calls in it at once (running or waiting)."""

    def __init__(self, threads: int = LEDGER_THREADS, queue: int = LEDGER_QUEUE) -> None:
        self.limit = threads + queue
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="medtpe-ledger")
        self._lock = threading.Lock()
        self._held = 0

    @property
    def held(self) -> int:
        """Calls in the pool now (running or waiting)."""
        return self._held

    async def run(self, call: Callable[..., Result], *args: Any) -> Result:
        """`call(*args)` on one of the pool's threads; `LedgerPoolFull` at once when the pool
        holds `limit` calls. A call its caller stopped awaiting (a request's deadline) keeps its
        place until it ends: the database's timeouts end it."""
        with self._lock:
            if self._held >= self.limit:
                raise LedgerPoolFull(
                    f"{self._held} ledger calls are running or waiting (at most {self.limit})"
                )
            self._held += 1
        try:
            submitted = self._executor.submit(functools.partial(call, *args))
        except RuntimeError:  # shut down
            self._release(None)
            raise
        submitted.add_done_callback(self._release)
        return await asyncio.wrap_future(submitted)

    def _release(self, _done: Future[Any] | None) -> None:
        with self._lock:
            self._held -= 1

    def shutdown(self) -> None:
        """Take no more calls (those running end on their own)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def caller_id(api_key: str | None) -> str:
    """Who asked, as the ledger names it: `key:` and the start of the API key's SHA-256, or
    `anonymous` without API keys."""
    if api_key is None:
        return "anonymous"
    return f"key:{hashlib.sha256(api_key.encode()).hexdigest()[:CALLER_KEY_CHARS]}"


def unavailable(detail: str) -> ApiError:
    """The 503 of an answer whose row cannot be written (`Retry-After`, reason
    `ledger_unavailable`)."""
    return ApiError(
        503,
        "ledger_unavailable",
        f"{detail}; no answer is given without its ledger row: retry",
        headers={"Retry-After": str(LEDGER_RETRY_AFTER_S)},
    )


class ServiceLedger:
    """The ledger one service instance writes to (none with `ledger_off`)."""

    def __init__(self, settings: LedgerSettings) -> None:
        self.settings = settings
        self.off = settings.ledger_off
        self.signer: Signer | None = None if self.off else settings.signer()
        self.ledger: Ledger | None = None
        self.failure: str | None = None
        """Why the ledger could not be opened (None: open, or not tried yet)."""
        self._tried_at = float("-inf")
        self._opening = asyncio.Lock()
        self.pool = LedgerPool()

    @property
    def ready(self) -> bool:
        """Whether answers can be recorded (always with the ledger off)."""
        return self.off or self.ledger is not None

    @property
    def keep_records(self) -> bool:
        """Whether rows keep the canonical record (`MEDTPE_LEDGER_RECORDS=store`)."""
        return self.settings.ledger_records == "store"

    async def open(self) -> None:
        """Open (and migrate) the ledger unless it is open or off; its failure kept in
        `failure` (tried again at most every `REOPEN_INTERVAL_S`)."""
        if self.ready:
            return
        async with self._opening:
            if self.ready or time.monotonic() - self._tried_at < REOPEN_INTERVAL_S:
                return
            self._tried_at = time.monotonic()
            try:
                self.ledger = await self.pool.run(self.settings.open_ledger)
                self.failure = None
                logger.info("ledger open: %s", mask_secrets(self.settings.ledger_url))
            except (LedgerUnavailable, LedgerPoolFull) as exc:
                self.failure = mask_secrets(str(exc))
                logger.error("ledger unavailable: %s", self.failure)

    async def close(self) -> None:
        """Close the database connections; the ledger's pool takes no more calls (a new one
        serves the ledger if it is opened again)."""
        if self.ledger is not None:
            await self.ledger.aclose()
            self.ledger = None
        self.pool.shutdown()
        self.pool = LedgerPool()

    def basis(self, facts: AnswerFacts) -> ReceiptBasis:
        """What an answer was derived from (`medtpe.ledger.answers.ReceiptBasis.of`, the record
        kept with `MEDTPE_LEDGER_RECORDS=store`): every row of that answer is signed on it."""
        return ReceiptBasis.of(facts, keep_record=self.keep_records)

    def row(
        self,
        basis: ReceiptBasis,
        *,
        door: str,
        caller: str,
        site: str | None = None,
        latency_ms: float | None = None,
        silent: bool = False,
        shadow_of: str | None = None,
    ) -> PredictionRow:
        """A new prediction's row on `basis`, signed with the service's key
        (`medtpe.ledger.answers.ReceiptBasis.signed`); `latency_ms`: this answer's, when not the
        basis' (a card from the score cache); `silent`: recorded, not shown; `shadow_of`: the
        prediction it shadows."""
        assert self.signer is not None, "no rows with the ledger off"
        return basis.signed(
            self.signer,
            door=door,
            caller=caller,
            site=site,
            latency_ms=latency_ms,
            silent=silent,
            shadow_of=shadow_of,
        )

    async def require(self) -> None:
        """Before an answer's work: a 503 `ledger_unavailable` when the ledger cannot be opened
        (an attempt made now, at most every `REOPEN_INTERVAL_S`)."""
        await self.open()
        if not self.ready:
            raise unavailable(self.failure or "the ledger is not open")

    async def commit(self, rows: Sequence[PredictionRow]) -> None:
        """Commit `rows` in one transaction before their answers leave; a 503
        `ledger_unavailable` when they cannot be (nothing with the ledger off)."""
        if self.off or not rows:
            return
        await self._write(Ledger.record, rows)

    async def commit_feedback(self, rows: Sequence[FeedbackRow]) -> None:
        """Commit CDS feedback rows before the feedback call is answered; a 503
        `ledger_unavailable` (the EHR sends it again) when they cannot be;
        `medtpe.ledger.feedback.UnrecordedPredictions` (nothing written) when the ledger holds no
        prediction of some (cards issued while it was off)."""
        if self.off or not rows:
            return
        await self._write(record_feedback, rows)

    async def _write(self, write: Callable[[Ledger, Any], None], rows: Sequence[Any]) -> None:
        await self.require()
        assert self.ledger is not None
        try:
            await self.pool.run(write, self.ledger, rows)
        except (LedgerUnavailable, LedgerPoolFull) as exc:
            logger.error("ledger write failed: %s", mask_secrets(str(exc)))
            raise unavailable("the ledger cannot be written now") from exc

    def readiness(self) -> dict[str, Any]:
        """`/readyz`'s account of the ledger: its URL (password masked), whether it is open."""
        if self.off:
            return {"status": "off"}
        body: dict[str, Any] = {
            "status": "open" if self.ledger is not None else "unavailable",
            "url": mask_secrets(self.settings.ledger_url),
            "records": self.settings.ledger_records,
        }
        if self.failure is not None and self.ledger is None:
            body["detail"] = self.failure
        return body
