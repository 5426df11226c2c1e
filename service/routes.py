"""The authenticated API: `/predict`, `/predict/batch`, `/tokenize`.

Handlers are a few lines: check the request against the service's limits, then hand the record
to the inference layer (`service.serving.predict_record`) inside `served` (admission, deadline,
in-flight gauge, latency histogram, one log line with endpoint, task, status, record count and
time — never record content). `service.responses` turns answers into response bodies.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Coroutine, Iterable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Header, Request

from inference.model import LoadedModel
from medtpe_core.tasks import Task, UnknownTaskError, get_task
from service.errors import ApiError, field_error
from service.fhir_input import bundle_events, fhir_mapping
from service.json_body import FastJsonRoute
from service.responses import tokenize_response
from service.schemas import (
    ERROR_RESPONSES,
    BatchRequest,
    BatchResponse,
    PredictRequest,
    PredictResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from service.serving import predict_record, served
from service.state import ServiceState

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


def _accepting(state: StateDep) -> None:
    """Once a stop began (`service.drain`), every API request is a 503 `shutting_down`."""
    state.refuse_if_draining()


router = APIRouter(
    dependencies=[Depends(_accepting), Depends(_require_api_key)],
    responses=ERROR_RESPONSES,
    route_class=FastJsonRoute,
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


def _checked(state: ServiceState, request: PredictRequest, loc: Sequence[str | int]) -> Task:
    """The request's task, once its options are within the service's limits."""
    task = _task(state, request.task, [*loc, "task"])
    limit = state.settings.max_n_samples
    if request.options.n_samples > limit:
        raise _invalid(
            state,
            [*loc, "options", "n_samples"],
            f"at most {limit} samples per record",
            "less_than_equal",
        )
    return task


@router.post("/predict", response_model=PredictResponse)
async def predict(body: PredictRequest, state: StateDep, salt: SaltDep) -> PredictResponse:
    """Predict the task for one record."""
    model = state.loaded(need_engine=True)
    task = _checked(state, body, ["body"])
    async with served(state, "predict", task.name, 1):
        return await _predict_request(state, model, task, body, salt, ["body"])


@router.post("/predict/batch", response_model=BatchResponse)
async def predict_batch(body: BatchRequest, state: StateDep, salt: SaltDep) -> BatchResponse:
    """Predict several records, generated concurrently; answers in request order."""
    model = state.loaded(need_engine=True)
    tasks = [_checked(state, r, ["body", "records", i]) for i, r in enumerate(body.records)]
    if len(body.records) > state.admission.capacity:
        limit = state.admission.capacity
        raise _invalid(state, ["body", "records"], f"at most {limit} records per batch", "too_long")
    names = {task.name for task in tasks}
    label = names.pop() if len(names) == 1 else "mixed"
    async with served(state, "predict_batch", label, len(tasks)):
        results = await _all(
            _predict_request(state, model, task, record, salt, ["body", "records", i])
            for i, (task, record) in enumerate(zip(tasks, body.records, strict=True))
        )
    return BatchResponse(results=results)


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(body: TokenizeRequest, state: StateDep) -> TokenizeResponse:
    """Both segmentations of a text, or of the full prompt of a record and task."""
    predictor = state.loaded(need_engine=False).predictor
    task = _task(state, body.task, ["body", "task"]) if body.task is not None else None
    start = time.perf_counter()
    if body.text is not None:
        seg = await asyncio.to_thread(predictor.segment, body.text)
        label = "text"
    else:
        assert task is not None  # the request model requires a task with events
        prepared = await asyncio.to_thread(
            predictor.prepare, task, body.events or [], body.prediction_time
        )
        seg, label = prepared.segmentation, task.name
    state.metrics.request_latency.labels("tokenize", label).observe(time.perf_counter() - start)
    return tokenize_response(predictor.tokenizer, seg)


async def _predict_request(
    state: ServiceState,
    model: LoadedModel,
    task: Task,
    request: PredictRequest,
    salt: str | None,
    loc: Sequence[str | int],
) -> PredictResponse:
    """A request's record (its events, or its FHIR bundle mapped in a worker thread) through
    `predict_record`; a bundle's mapping counts in the response."""
    start = time.perf_counter()
    events, fhir = request.events, None
    if request.bundle is not None:
        mapping = state.site_mapping()
        try:
            events, fhir = await asyncio.to_thread(
                bundle_events, mapping, request.bundle, request.prediction_time, loc
            )
        except ApiError:
            state.metrics.rejections.labels("invalid").inc()
            raise
    assert events is not None  # the request model requires events or a bundle
    descriptions = fhir.descriptions if fhir is not None else None
    response = await predict_record(
        state,
        model,
        task,
        events,
        request.prediction_time,
        request.options,
        salt,
        descriptions=descriptions,
        start=start,
    )
    if fhir is not None:
        response.fhir = fhir_mapping(fhir)
    return response


async def _all(coroutines: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Run concurrently; the first failure cancels the rest and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as group:
            jobs = [group.create_task(coroutine) for coroutine in coroutines]
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [job.result() for job in jobs]
