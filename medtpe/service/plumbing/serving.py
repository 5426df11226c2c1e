"""What every route that predicts shares: `served` (admission, deadline, in-flight gauge, latency
histogram and one log line per request — never record content), `prepare` (the record the
request brought, `medtpe.inference.record`, into its prompt in a worker thread; `prepare_all`: into
several tasks' prompts, the record rendered once) and `predict_record` (the prepared record's
answer, decoded as its `medtpe.inference.sampling.Sampling` says, in a concurrency slot on the
async engine; `predict_all`: several tasks' prompts about one record, the record computed once).
`/predict`, `/predict/batch`, `/tokenize` and the CDS hooks all answer through them."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from medtpe.core.fhir import FhirInputError
from medtpe.core.tasks import Task
from medtpe.inference.engines.protocol import EngineDead
from medtpe.inference.model import LoadedModel
from medtpe.inference.predictor import Predictor, PreparedRecord, RecordAnswer
from medtpe.inference.record import NoEventsError, PatientRecord
from medtpe.inference.sampling import Sampling
from medtpe.service.plumbing.errors import ApiError, field_error
from medtpe.service.plumbing.limits import QueueFull
from medtpe.service.plumbing.metrics import API_SITE, prefix_part
from medtpe.service.plumbing.state import ServiceState
from medtpe.service.settings import ServiceSettings

logger = logging.getLogger("medtpe.service")


Loc = Sequence[str | int]


async def prepare(
    predictor: Predictor,
    task: Task,
    record: PatientRecord,
    locate: Callable[[FhirInputError | None], Loc] | None = None,
) -> PreparedRecord:
    """The record's prompt by `predictor`, prepared in a worker thread; for FHIR resources,
    input the mapping cannot read or a record without an event of its patient is a 422 at
    `locate(error)` (`locate(None)` for no event): where the request sent it."""
    (prepared,) = await prepare_all(predictor, [task], record, locate)
    return prepared


async def prepare_all(
    predictor: Predictor,
    tasks: Sequence[Task],
    record: PatientRecord,
    locate: Callable[[FhirInputError | None], Loc] | None = None,
) -> list[PreparedRecord]:
    """`prepare` for several tasks about the record, rendered once (`prepare_all` of
    `medtpe.inference.record`): each task's prompt, in order."""
    try:
        return await asyncio.to_thread(record.prepare_all, predictor, tasks)
    except FhirInputError as exc:
        if locate is None:
            raise
        detail = field_error(locate(exc), str(exc), "fhir_input")
    except NoEventsError as exc:
        if locate is None:
            raise
        detail = field_error(locate(None), str(exc), "fhir_no_events")
    raise ApiError(422, "invalid_request", detail)


def served_sampling(settings: ServiceSettings) -> Sampling:
    """The instance's decoding: one answer at its temperature (`MEDTPE_TEMPERATURE`), at most
    `MEDTPE_MAX_NEW_TOKENS` long, the answer options' probabilities asked for."""
    return Sampling(temperature=settings.temperature, max_new_tokens=settings.max_new_tokens)


async def predict_record(
    state: ServiceState,
    model: LoadedModel,
    record: PreparedRecord,
    sampling: Sampling,
    salt: str | None,
    start: float | None = None,
    site: str = API_SITE,
) -> RecordAnswer:
    """Generate the answer to a prepared record, decoded as `sampling` says, within a
    concurrency slot on the engine of `model` (the served mode's, or with
    `MEDTPE_COMPARE_MODES` the other mode's `state.other_model`: the record's ids in that
    mode); `start`: when the request's work began (`time.perf_counter()`; default now), for its
    reported total latency; `site`: the drift counters' site label (a CDS service's id)."""
    (answered,) = await predict_all(state, model, [record], sampling, salt, start, site)
    return answered


async def predict_all(
    state: ServiceState,
    model: LoadedModel,
    records: Sequence[PreparedRecord],
    sampling: Sampling,
    salt: str | None,
    start: float | None = None,
    site: str = API_SITE,
) -> list[RecordAnswer]:
    """`predict_record` for several tasks' prompts about one record (`prepare_all`), answered
    by `Predictor.answer_all` within one concurrency slot (the record prefilled once, then
    every task reading it from the engine's prefix cache); each answer observed under its own
    task and the part of its prompt it shared (`prefix_part`)."""
    start = time.perf_counter() if start is None else start
    predictor = model.predictor
    async with state.admission.slot(), _engine_errors(state):
        answers = await predictor.answer_all(
            state.running_engine(other_mode=model is state.other_model),
            records,
            sampling,
            cache_salt=salt,
        )
    prefix = prefix_part(len(records))
    for record, answer in zip(records, answers, strict=True):
        seg = record.segmentation
        state.metrics.observe_answer(record.task.name, predictor.mode, seg, answer, prefix)
        if model is not state.other_model:  # the record's figures, once per record
            state.metrics.observe_drift(site, model, record)
    total_s = time.perf_counter() - start
    return [RecordAnswer(r, a, total_s) for r, a in zip(records, answers, strict=True)]


@asynccontextmanager
async def _engine_errors(state: ServiceState) -> AsyncIterator[None]:
    """A dead engine is a 503 (and counted), not an internal error."""
    try:
        yield
    except EngineDead as exc:
        state.metrics.errors.labels("engine").inc()
        raise ApiError(503, "engine_dead", "the engine died; this instance is not ready") from exc


@asynccontextmanager
async def served(
    state: ServiceState, endpoint: str, task: str, n_records: int
) -> AsyncIterator[None]:
    """Admission, deadline (brought forward by a stop: 503 `shutting_down`), in-flight gauge,
    latency histogram and one log line per request."""
    metrics = state.metrics
    start = time.perf_counter()
    status = 200
    try:
        with state.admission.admit(n_records), metrics.inflight.track_inprogress():
            async with state.deadline(state.settings.request_timeout_s):
                yield
    except QueueFull as exc:
        status = 503
        metrics.rejections.labels("queue_full").inc()
        raise ApiError(
            503,
            "queue_full",
            "too many requests in flight; retry later",
            headers={"Retry-After": str(exc.retry_after_s)},
        ) from exc
    except TimeoutError as exc:
        if state.drain_expired:  # the stop's grace period ended first
            status = 503
            metrics.errors.labels("shutting_down").inc()
            raise state.shutting_down("the service stopped before the answer") from exc
        status = 504
        metrics.errors.labels("timeout").inc()
        raise ApiError(
            504, "timeout", f"no answer within {state.settings.request_timeout_s} s"
        ) from exc
    except ApiError as exc:
        status = exc.status
        raise
    except Exception as exc:
        status = 500
        metrics.errors.labels("internal").inc()
        # the exception text may quote record content: log its type and stack only
        logger.error(
            "internal error %s on %s\n%s",
            type(exc).__name__,
            endpoint,
            "".join(traceback.format_tb(exc.__traceback__)),
        )
        raise ApiError(500, "internal", "internal error") from exc
    finally:
        elapsed = time.perf_counter() - start
        metrics.request_latency.labels(endpoint, task).observe(elapsed)
        logger.info(
            "%s task=%s records=%d status=%d ms=%.1f",
            endpoint,
            task,
            n_records,
            status,
            elapsed * 1e3,
        )
