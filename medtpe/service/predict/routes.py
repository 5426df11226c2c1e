"""The authenticated API: `/predict`, `/predict/batch`, `/tokenize`.

A request is refused while the service drains, then without a valid API key, before its body is
read (`ApiRoute`). Handlers are a few lines: check the request against the service's limits,
then hand the record to the inference layer (`medtpe.service.plumbing.serving.predict_all`, or
the tokenizer) inside `served` (admission, deadline, in-flight gauge, latency histogram, one log
line with endpoint, task, status, record count and time — never record content).
`medtpe.service.predict.responses` turns answers into response bodies.

A record asked several `tasks` is read and rendered once for all of them and answered by
`Predictor.answer_all` (the record prefilled once, then every task together, each reading the
record from the engine's prefix cache); admission counts what that costs (`tasks_cost`), once
the prompts are known.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Coroutine, Iterable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request

from medtpe.core.tasks import Task, UnknownTaskError, get_task
from medtpe.inference.model import LoadedModel
from medtpe.inference.predictor import Predictor, PreparedRecord, RecordAnswer
from medtpe.inference.receipt_facts import answer_facts
from medtpe.inference.record import FhirResources, MedsRecord
from medtpe.inference.sampling import Sampling
from medtpe.ledger.store import PredictionRow
from medtpe.service.plumbing.errors import ApiError, field_error
from medtpe.service.plumbing.json_body import FastJsonRoute
from medtpe.service.plumbing.ledger_writes import caller_id
from medtpe.service.plumbing.limits import tasks_cost
from medtpe.service.plumbing.metrics import MIXED_TASKS
from medtpe.service.plumbing.receipts import receipt_body
from medtpe.service.plumbing.serving import (
    predict_all,
    prepare,
    prepare_all,
    served,
    served_sampling,
)
from medtpe.service.plumbing.shadow import ShadowJob
from medtpe.service.plumbing.state import ServiceState
from medtpe.service.predict.responses import (
    predict_response,
    tasks_response,
    tokenize_response,
    tokenize_tasks_response,
)
from medtpe.service.predict.schemas import (
    BUDGET,
    ERROR_RESPONSES,
    BatchRequest,
    BatchResponse,
    PredictAnswer,
    PredictRequest,
    PredictResponse,
)
from medtpe.service.predict.tokenize_schemas import (
    TokenizeAnswer,
    TokenizeRequest,
    TokenizeTasksResponse,
)

T = TypeVar("T")


def _state(request: Request) -> ServiceState:
    return request.app.state.service


async def _state_dependency(request: Request) -> ServiceState:
    # async: FastAPI runs a plain function dependency in a worker thread, one hop per request
    return _state(request)


StateDep = Annotated[ServiceState, Depends(_state_dependency)]


API_KEY_HEADER = "x-api-key"
AUTHORIZATION_HEADER = "authorization"
_BEARER = "bearer "


def caller_key(
    state: ServiceState, request: Request, accepted: Sequence[str] | None = None
) -> str | None:
    """The caller's key from `Authorization: Bearer KEY` or `X-API-Key: KEY`, when keys are
    configured (`accepted`, default the API keys; None when authentication is off); else a 401
    naming the header."""
    keys = state.settings.api_keys if accepted is None else accepted
    if not keys:
        return None
    given = request.headers.get(API_KEY_HEADER)
    header = API_KEY_HEADER if given is not None else AUTHORIZATION_HEADER
    authorization = request.headers.get(AUTHORIZATION_HEADER, "")
    if authorization[: len(_BEARER)].lower() == _BEARER:
        header, given = AUTHORIZATION_HEADER, authorization[len(_BEARER) :].strip()
    # compared as bytes: a header's text is Latin-1, and compare_digest refuses non-ASCII str
    sent = given.encode("latin-1") if given is not None else None
    if sent is None or not any(secrets.compare_digest(sent, key.encode()) for key in keys):
        state.metrics.rejections.labels("unauthorized").inc()
        msg = "a valid API key is required (Authorization: Bearer KEY or X-API-Key: KEY)"
        raise ApiError(
            401,
            "unauthorized",
            field_error(["header", header], msg, "unauthorized"),
            headers={"WWW-Authenticate": "Bearer"},
        )
    return given


class ApiRoute(FastJsonRoute):
    """An API route that refuses a request while the service drains (503 `shutting_down`,
    `medtpe.service.drain`), then one without a valid API key (401), before its body is read."""

    async def before_body(self, request: Request) -> None:
        """The drain and API key checks; the caller's key kept in `request.state`."""
        state = _state(request)
        state.refuse_if_draining()
        request.state.api_key = caller_key(state, request)


async def _cache_salt(request: Request, state: StateDep) -> str | None:
    """The caller's cache salt (`medtpe.service.plumbing.tenancy`): of its API key, else of its
    tenant header."""
    api_key = request.state.api_key
    header = state.settings.cache_salt_header
    if api_key is None and header:
        return state.salts.of(request.headers.get(header))
    return state.salts.of(api_key)


SaltDep = Annotated[str | None, Depends(_cache_salt)]


router = APIRouter(responses=ERROR_RESPONSES, route_class=ApiRoute)


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
) -> tuple[list[Task], Predictor]:
    """The request's tasks and predictor, once its options are within the service's limits."""
    if request.tasks is None:
        tasks = [_task(state, name, [*loc, "task"]) for name in request.task_names]
    else:
        tasks = [_task(state, name, [*loc, "tasks", i]) for i, name in enumerate(request.tasks)]
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
    return tasks, _at_budget(state, model, options.max_input_tokens, budget_loc)


def _label(tasks: Iterable[Task]) -> str:
    """The latency metric's `task` label of a request: its task, or `MIXED_TASKS`."""
    names = {task.name for task in tasks}
    return names.pop() if len(names) == 1 else MIXED_TASKS


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


@router.post("/predict", response_model=PredictAnswer)
async def predict(
    body: PredictRequest, state: StateDep, salt: SaltDep, request: Request
) -> PredictAnswer:
    """Predict the task (or each of the tasks) for one record; the answer leaves once its
    ledger rows are committed."""
    model = state.loaded(need_engine=True)
    tasks, predictor = _checked(state, model, body, ["body"])
    _within_capacity(state, len(tasks), ["body", "tasks"], "tasks on this instance")
    asked = _Asked("predict", caller_id(request.state.api_key), salt)
    async with served(state, "predict", _label(tasks), 1):
        await state.ledger.require()
        response = await _predict_request(state, model, predictor, tasks, body, asked, ["body"])
        await state.ledger.commit(asked.rows)
    state.shadows.offer(state, asked.shadows)  # after the answer left admission control
    return response


@router.post("/predict/batch", response_model=BatchResponse)
async def predict_batch(
    body: BatchRequest, state: StateDep, salt: SaltDep, request: Request
) -> BatchResponse:
    """Predict several records, generated concurrently; answers in request order, once every
    record's ledger row is committed (in one transaction)."""
    model = state.loaded(need_engine=True)
    checked = [
        _checked(state, model, r, ["body", "records", i]) for i, r in enumerate(body.records)
    ]
    n_prompts = sum(len(tasks) for tasks, _ in checked)
    what = "records per batch"
    if n_prompts > len(checked):
        what = "prompts per batch (each of a record's `tasks` counts as one)"
    _within_capacity(state, n_prompts, ["body", "records"], what)
    label = _label(task for tasks, _ in checked for task in tasks)
    asked = _Asked("predict_batch", caller_id(request.state.api_key), salt)
    async with served(state, "predict_batch", label, len(checked)):
        await state.ledger.require()
        results = await _all(
            _predict_request(state, model, predictor, tasks, record, asked, ["body", "records", i])
            for i, ((tasks, predictor), record) in enumerate(
                zip(checked, body.records, strict=True)
            )
        )
        await state.ledger.commit(asked.rows)
    state.shadows.offer(state, asked.shadows)
    return BatchResponse(results=results)


def _within_capacity(
    state: ServiceState, n_prompts: int, loc: Sequence[str | int], what: str
) -> None:
    """A 422 for a request of more prompts (a record's task, or each of its `tasks`) than
    admission control holds at once, whatever its records share: at most that many `what`."""
    limit = state.admission.capacity
    if n_prompts > limit:
        raise _invalid(state, loc, f"at most {limit} {what}", "too_long")


@router.post("/tokenize", response_model=TokenizeAnswer)
async def tokenize(body: TokenizeRequest, state: StateDep) -> TokenizeAnswer:
    """Both segmentations of a text, or of the full prompt of a record and task (with its event
    counts and input budget), or of a record's prompts for several `tasks` (the record rendered
    once, the part they share given once); each MedTPE token with the pair it merges."""
    model = state.loaded(need_engine=False)
    if body.tasks is not None:
        return await _tokenize_tasks(state, model, body, body.tasks)
    task = _task(state, body.task, ["body", "task"]) if body.task is not None else None
    if body.text is not None:
        limit = state.settings.max_tokenize_text_bytes
        if len(body.text) > limit // 4 and len(body.text.encode()) > limit:
            msg = f"at most {limit} UTF-8 bytes (MEDTPE_MAX_TOKENIZE_TEXT_BYTES)"
            raise _invalid(state, ["body", "text"], msg, "too_long")
        async with served(state, "tokenize", "text", 1):
            seg = await asyncio.to_thread(model.predictor.segment, body.text)
            return tokenize_response(model.predictor.tokenizer, seg, None)
    assert task is not None  # the request model requires a task with events ...
    predictor = _at_budget(state, model, body.max_input_tokens, ["body", BUDGET])
    assert body.events is not None  # ... and events
    async with served(state, "tokenize", task.name, 1):
        record = MedsRecord(body.events, body.prediction_time)
        prepared = await prepare(predictor, task, record)
        return tokenize_response(model.predictor.tokenizer, prepared.segmentation, prepared)


async def _tokenize_tasks(
    state: ServiceState, model: LoadedModel, body: TokenizeRequest, names: Sequence[str]
) -> TokenizeTasksResponse:
    """`/tokenize` of a record's prompts for several tasks (`TokenizeTasksResponse`)."""
    tasks = [_task(state, name, ["body", "tasks", i]) for i, name in enumerate(names)]
    predictor = _at_budget(state, model, body.max_input_tokens, ["body", BUDGET])
    assert body.events is not None  # the request model refuses `tasks` without events
    async with served(state, "tokenize", _label(tasks), 1):
        record = MedsRecord(body.events, body.prediction_time)
        prepared = await prepare_all(predictor, tasks, record)
        return tokenize_tasks_response(model.predictor.tokenizer, prepared)


class _Asked:
    """Who asked through which door, and the ledger rows of the request's answers so far (with
    the served mode's answers, for the fidelity shadow)."""

    def __init__(self, door: str, caller: str, salt: str | None) -> None:
        self.door, self.caller, self.salt = door, caller, salt
        self.rows: list[PredictionRow] = []
        self.shadows: list[ShadowJob] = []


async def _predict_request(
    state: ServiceState,
    model: LoadedModel,
    predictor: Predictor,
    tasks: Sequence[Task],
    request: PredictRequest,
    asked: _Asked,
    loc: Sequence[str | int],
) -> PredictAnswer:
    """A request's record prepared by `predictor` (the request's budget) for its tasks and
    answered, admitted at what its further tasks' prompts add (`tasks_cost`), each answer's
    ledger row added to `asked.rows`; a bundle's mapping counts in the response; with
    `options.both_modes` the other mode's answer to the same prompt in `other_mode` (a row of
    its own). The answer to a `task` is its `PredictResponse`, to `tasks` a
    `PredictTasksResponse`."""
    start = time.perf_counter()
    prepared = await _prepared(state, predictor, tasks, request, loc)
    sampling = request.options.sampling(served_sampling(state.settings))
    mode = model.predictor.mode
    lengths = [len(p.ids(mode)) for p in prepared]
    further = tasks_cost(lengths, prepared[0].segmentation.n_shared(mode)) - 1
    with state.admission.admit(further):
        answered = await predict_all(state, model, prepared, sampling, asked.salt, start)
        other = state.other_model
        others: list[RecordAnswer] = []
        if request.options.both_modes:
            assert other is not None  # `_checked` refused both_modes without it
            others = await predict_all(state, other, prepared, sampling, asked.salt)
    reused = sum(a.answer.cached_tokens for a in (*answered, *others))
    state.metrics.prefill_reused_tokens.labels(asked.door).inc(reused)
    responses = []
    for i, answer in enumerate(answered):
        response = _recorded(state, model, sampling, answer, request, asked)
        if others:
            assert other is not None
            response.other_mode = _recorded(state, other, sampling, others[i], request, asked)
        responses.append(response)
    if request.tasks is None:
        return responses[0]
    return tasks_response(responses, answered)


def _recorded(
    state: ServiceState,
    model: LoadedModel,
    sampling: Sampling,
    answered: RecordAnswer,
    request: PredictRequest,
    asked: _Asked,
) -> PredictResponse:
    """The response to one answer with its prediction id and signed receipt, its row added to
    `asked.rows` (none with the ledger off)."""
    response = predict_response(model, answered, request.options)
    if state.ledger.off:
        return response
    engine = state.running_engine(other_mode=model is state.other_model)
    facts = answer_facts(
        model, engine, answered.record, sampling, answered.answer, answered.total_s
    )
    row = state.ledger.row(state.ledger.basis(facts), door=asked.door, caller=asked.caller)
    asked.rows.append(row)
    if model is state.model:
        asked.shadows.append(ShadowJob(model, answered.record, sampling, asked.salt, row))
    response.prediction_id = row.prediction_id
    response.receipt = receipt_body(row)
    return response


async def _prepared(
    state: ServiceState,
    predictor: Predictor,
    tasks: Sequence[Task],
    request: PredictRequest,
    loc: Sequence[str | int],
) -> list[PreparedRecord]:
    """The request's record — its events, or its FHIR bundle through the site mapping — as
    `predictor` prepares it for each task, rendered once (a bundle it cannot map: a 422 naming
    entry, resource and field)."""
    if request.bundle is None:
        assert request.events is not None  # the request model requires events or a bundle
        record = MedsRecord(request.events, request.prediction_time)
        return await prepare_all(predictor, tasks, record)
    where = [*loc, "bundle"]
    bundle = FhirResources(request.bundle, state.site_mapping(), request.prediction_time)
    try:
        return await prepare_all(
            predictor, tasks, bundle, lambda error: [*where, *(error.loc if error else ["entry"])]
        )
    except ApiError:
        state.metrics.rejections.labels("invalid").inc()
        raise


async def _all(coroutines: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Run concurrently; the first failure cancels the rest and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as group:
            jobs = [group.create_task(coroutine) for coroutine in coroutines]
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [job.result() for job in jobs]


def attach(app: FastAPI) -> None:
    """Serve `/predict`, `/predict/batch` and `/tokenize` on the app."""
    app.include_router(router)
