"""The live fidelity shadow: a share of the answers (`MEDTPE_SHADOW_RATE`, drawn at random per
answer) is answered a second time from the original tokenizer's ids, off the request path, and
recorded as a ledger row linked to the answer (`shadow_of`, never shown: `silent`).

On the same engine: the served MedTPE checkpoint reads base ids as the base model does, except
the ids a replacement artefact evicted and gave to its new tokens; the shadow's prompt is the
prompt's original ids with each evicted token decomposed into the base tokens it merges
(`Predictor.uncompressed`: the text in the base model's own tokens, none merged), so the two
rows differ only by the compression.

Dropped first under load, never delaying an answer: offered once the answer's row is committed
and its request has left admission control; kept in a bounded queue (full: dropped); one shadow
generates at a time, and only while a generation slot is free (else dropped); each drop counted
(`medtpe_shadow_dropped_total`)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from medtpe.inference.model import LoadedModel
from medtpe.inference.predictor import PreparedRecord
from medtpe.inference.receipt_facts import answer_facts
from medtpe.inference.sampling import Sampling
from medtpe.ledger.store import PredictionRow
from medtpe.service.plumbing.metrics import ServiceMetrics

if TYPE_CHECKING:
    from medtpe.service.plumbing.state import ServiceState

logger = logging.getLogger("medtpe.service")


@dataclass(frozen=True)
class ShadowJob:
    """One answer to shadow: its record as the answer's predictor prepared it, its decoding,
    its caller's cache salt and its committed ledger row."""

    model: LoadedModel
    prepared: PreparedRecord
    sampling: Sampling
    salt: str | None
    shown: PredictionRow


class Shadows:
    """The shadow queue of one API process and its worker (started at the first offer)."""

    def __init__(
        self,
        rate: float,
        queue_size: int,
        metrics: ServiceMetrics,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.rate = rate
        self.metrics = metrics
        self._draw = draw
        self._queue: asyncio.Queue[ShadowJob] = asyncio.Queue(queue_size)
        self._worker: asyncio.Task[None] | None = None

    def offer(self, state: ServiceState, jobs: Iterable[ShadowJob]) -> None:
        """Queue each job drawn for a shadow (after its answer left admission control); a full
        queue or no free generation slot drops it (counted)."""
        for job in jobs:
            if self.rate <= 0 or self._draw() >= self.rate:
                continue
            if _busy(state):
                self._dropped(job, "busy")
            elif self._queue.full():
                self._dropped(job, "queue_full")
            else:
                self._queue.put_nowait(job)
                if self._worker is None or self._worker.done():
                    self._worker = asyncio.create_task(self._work(state))

    def close(self) -> None:
        """Stop the worker (queued shadows are dropped uncounted: the service is stopping)."""
        if self._worker is not None:
            self._worker.cancel()

    async def _work(self, state: ServiceState) -> None:
        while True:
            job = await self._queue.get()
            if _busy(state):
                self._dropped(job, "busy")
                continue
            try:
                await self._answer(state, job)
            except Exception as exc:  # an engine or ledger failure (ApiError): logged, counted
                self._dropped(job, "failed")
                name = type(exc).__name__
                logger.warning("shadow of %s failed: %s", job.shown.prediction_id, name)

    async def _answer(self, state: ServiceState, job: ShadowJob) -> None:
        """Answer the job's original ids on the served engine, record the linked row, count
        agreement and |Δp|."""
        start = time.perf_counter()
        model, shown = job.model, job.shown
        prepared = await asyncio.to_thread(model.predictor.uncompressed, job.prepared)
        engine = state.running_engine()
        answer = await model.predictor.answer(engine, prepared, job.sampling, cache_salt=job.salt)
        facts = answer_facts(
            model, engine, prepared, job.sampling, answer, time.perf_counter() - start
        )
        basis = await asyncio.to_thread(state.ledger.basis, facts)  # the record hashed
        row = state.ledger.row(
            basis,
            door=shown.door,
            caller=shown.caller,
            site=shown.site,
            silent=True,
            shadow_of=shown.prediction_id,
        )
        await state.ledger.commit([row])
        self.metrics.observe_shadow(shown.task, shown, row)

    def _dropped(self, job: ShadowJob, reason: str) -> None:
        self.metrics.shadow_dropped.labels(job.shown.task, reason).inc()


def _busy(state: ServiceState) -> bool:
    """Whether live records hold (or wait for) every generation slot, or the service stops."""
    admission = state.admission
    return state.draining or admission.admitted >= admission.max_concurrency
