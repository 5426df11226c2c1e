"""The authenticated API: `/predict`, `/predict/batch`, `/tokenize`.

Handlers are a few lines: check the request against the service's limits, then hand the record
to the inference layer (`inference.predictor.Predictor`) inside `_served` (admission, deadline,
in-flight gauge, latency histogram, one log line with endpoint, task, status, record count and
time — never record content). `service.responses` turns answers into response bodies.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import traceback
from collections.abc import AsyncIterator, Coroutine, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Header, Request

from inference.engine import EngineDead
from inference.model import LoadedModel
from inference.predictor import Predictor
from medtpe_core.tasks import Task, UnknownTaskError, get_task
from service.errors import ApiError, field_error
from service.json_body import FastJsonRoute
from service.limits import QueueFull
from service.responses import predict_response, tokenize_response
from service.schemas import (
    BUDGET,
    ERROR_RESPONSES,
    BatchRequest,
    BatchResponse,
    PredictRequest,
    PredictResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from service.state import ServiceState

logger = logging.getLogger("medtpe.service")
T = TypeVar("T")


def _state(request: Request) -> ServiceState:
    return request.app.state.service


StateDep = Annotated[ServiceState, Depends(_state)]


def _require_api_key(
    state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> str | None:
    """`Authorization: Bearer KEY` or `X-API-Key: KEY`, when API keys are configured; the
    caller's key (None when authentication is off)."""
    keys = state.settings.api_keys
    if not keys:
        return None
    given = x_api_key
    if authorization and authorization.lower().startswith("bearer "):
        given = authorization[7:].strip()
    if given is None or not any(secrets.compare_digest(given, key) for key in keys):
        state.metrics.rejections.labels("unauthorized").inc()
        raise ApiError(
            401,
            "unauthorized",
            "a valid API key is required (Authorization: Bearer KEY or X-API-Key)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return given


def _cache_salt(
    request: Request,
    state: StateDep,
    api_key: Annotated[str | None, Depends(_require_api_key)],
) -> str | None:
    """The caller's cache salt (`service.tenancy`): of its API key, else of its tenant header."""
    header = state.settings.cache_salt_header
    if api_key is None and header:
        return state.salts.of(request.headers.get(header))
    return state.salts.of(api_key)


SaltDep = Annotated[str | None, Depends(_cache_salt)]


router = APIRouter(
    dependencies=[Depends(_require_api_key)], responses=ERROR_RESPONSES, route_class=FastJsonRoute
)


def _task(state: ServiceState, name: str, loc: Sequence[str | int]) -> Task:
    try:
        return get_task(name)
    except UnknownTaskError as exc:
        state.metrics.rejections.labels("unknown_task").inc()
        raise ApiError(422, "unknown_task", field_error(loc, str(exc), "unknown_task")) from exc


def _invalid(state: ServiceState, loc: Sequence[str | int], msg: str, type_: str) -> ApiError:
    state.metrics.rejections.labels("invalid").inc()
    return ApiError(422, "invalid_request", field_error(loc, msg, type_))


def _checked(
    state: ServiceState, model: LoadedModel, request: PredictRequest, loc: Sequence[str | int]
) -> tuple[Task, Predictor]:
    """The request's task and predictor, once its options are within the service's limits."""
    task = _task(state, request.task, [*loc, "task"])
    options = request.options
    limit = state.settings.max_n_samples
    if options.n_samples > limit:
        raise _invalid(
            state,
            [*loc, "options", "n_samples"],
            f"at most {limit} samples per record",
            "less_than_equal",
        )
    if options.both_modes and state.other_model is None:
        raise _invalid(
            state,
            [*loc, "options", "both_modes"],
            f"this instance answers in {state.settings.mode} mode only (start it with "
            "MEDTPE_COMPARE_MODES=true to answer in both)",
            "not_offered",
        )
    budget_loc = [*loc, "options", BUDGET]
    return task, _at_budget(state, model, options.max_input_tokens, budget_loc)


def _at_budget(
    state: ServiceState, model: LoadedModel, budget: int | None, loc: Sequence[str | int]
) -> Predictor:
    """The model's predictor at the request's input budget (None: the served one), once within
    `ServiceState.budget_range`."""
    if budget is None:
        return model.predictor
    budgets = state.budget_range
    assert budgets is not None  # set before the model that `loaded` returned
    low, high = budgets
    if not low <= budget <= high:
        msg = f"the input budget must be between {low} and {high} tokens on this instance"
        raise _invalid(state, loc, msg, "out_of_range")
    return model.predictor.at_budget(budget)


@router.post("/predict", response_model=PredictResponse)
async def predict(body: PredictRequest, state: StateDep, salt: SaltDep) -> PredictResponse:
    """Predict the task for one record."""
    model = state.loaded(need_engine=True)
    task, predictor = _checked(state, model, body, ["body"])
    async with _served(state, "predict", task.name, 1):
        return await _predict_record(state, model, predictor, task, body, salt)


@router.post("/predict/batch", response_model=BatchResponse)
async def predict_batch(body: BatchRequest, state: StateDep, salt: SaltDep) -> BatchResponse:
    """Predict several records, generated concurrently; answers in request order."""
    model = state.loaded(need_engine=True)
    checked = [
        _checked(state, model, r, ["body", "records", i]) for i, r in enumerate(body.records)
    ]
    if len(body.records) > state.admission.capacity:
        limit = state.admission.capacity
        raise _invalid(state, ["body", "records"], f"at most {limit} records per batch", "too_long")
    names = {task.name for task, _ in checked}
    label = names.pop() if len(names) == 1 else "mixed"
    async with _served(state, "predict_batch", label, len(checked)):
        results = await _all(
            _predict_record(state, model, predictor, task, record, salt)
            for (task, predictor), record in zip(checked, body.records, strict=True)
        )
    return BatchResponse(results=results)


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(body: TokenizeRequest, state: StateDep) -> TokenizeResponse:
    """Both segmentations of a text, or of the full prompt of a record and task (with its event
    counts and input budget); each MedTPE token with the pair it merges."""
    model = state.loaded(need_engine=False)
    task = _task(state, body.task, ["body", "task"]) if body.task is not None else None
    start = time.perf_counter()
    record = None
    if body.text is not None:
        seg = await asyncio.to_thread(model.predictor.segment, body.text)
        label = "text"
    else:
        assert task is not None  # the request model requires a task with events
        predictor = _at_budget(state, model, body.max_input_tokens, ["body", BUDGET])
        record = await asyncio.to_thread(
            predictor.prepare, task, body.events or [], body.prediction_time
        )
        seg, label = record.segmentation, task.name
    state.metrics.request_latency.labels("tokenize", label).observe(time.perf_counter() - start)
    return tokenize_response(model.predictor.tokenizer, seg, record)


async def _predict_record(
    state: ServiceState,
    model: LoadedModel,
    predictor: Predictor,
    task: Task,
    request: PredictRequest,
    salt: str | None,
) -> PredictResponse:
    """The record's answer, and with `options.both_modes` the other mode's in `other_mode`."""
    answer = await _answer(state, model, predictor, task, request, salt, other_mode=False)
    if not request.options.both_modes:
        return answer
    other = state.other_model
    assert other is not None  # `_checked` refused both_modes without it
    at_budget = other.predictor.at_budget(predictor.max_input_tokens)
    compared = await _answer(state, other, at_budget, task, request, salt, other_mode=True)
    return answer.model_copy(update={"other_mode": compared})


async def _answer(
    state: ServiceState,
    model: LoadedModel,
    predictor: Predictor,
    task: Task,
    request: PredictRequest,
    salt: str | None,
    other_mode: bool,
) -> PredictResponse:
    """Render and tokenize (worker thread), then generate within a concurrency slot on the
    served mode's engine or, with `other_mode`, the other's."""
    start = time.perf_counter()
    record = await asyncio.to_thread(
        predictor.prepare, task, request.events, request.prediction_time
    )
    temperature = request.options.temperature
    if temperature is None:
        temperature = state.settings.temperature
    async with state.admission.slot(), _engine_errors(state):
        answer = await predictor.answer(
            state.running_engine(other_mode),
            record,
            n_samples=request.options.n_samples,
            temperature=temperature,
            max_new_tokens=state.settings.max_new_tokens,
            probabilities=request.options.return_probabilities,
            constrained=request.options.constrained,
            cache_salt=salt,
        )
    state.metrics.observe_answer(task.name, predictor.mode, record.segmentation, answer)
    return predict_response(model, record, answer, request.options, time.perf_counter() - start)


@asynccontextmanager
async def _engine_errors(state: ServiceState) -> AsyncIterator[None]:
    """A dead engine is a 503 (and counted), not an internal error."""
    try:
        yield
    except EngineDead as exc:
        state.metrics.errors.labels("engine").inc()
        raise ApiError(503, "engine_dead", "the engine died; this instance is not ready") from exc


@asynccontextmanager
async def _served(
    state: ServiceState, endpoint: str, task: str, n_records: int
) -> AsyncIterator[None]:
    """Admission, deadline, in-flight gauge, latency histogram and one log line per request."""
    metrics = state.metrics
    start = time.perf_counter()
    status = 200
    try:
        with state.admission.admit(n_records), metrics.inflight.track_inprogress():
            async with asyncio.timeout(state.settings.request_timeout_s):
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


async def _all(coroutines: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Run concurrently; the first failure cancels the rest and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as group:
            jobs = [group.create_task(coroutine) for coroutine in coroutines]
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [job.result() for job in jobs]
