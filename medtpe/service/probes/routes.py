"""Endpoints for orchestrators and Prometheus: `/healthz` and `/readyz` (always open) and
`/metrics` (with `MEDTPE_API_KEYS` or `MEDTPE_METRICS_KEYS` set, a bearer token of either is
required unless `MEDTPE_METRICS_PUBLIC=true`). All three read the instance's status from
`ServiceState.status`."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from medtpe.service.plumbing.state import ServiceState
from medtpe.service.predict.routes import caller_key
from medtpe.service.predict.schemas import HEALTH_RESPONSES, METRICS_RESPONSES, READY_RESPONSES
from medtpe.service.predict.task_choice import TASK_NAMES

_UNHEALTHY = ("failed", "engine_dead")

router = APIRouter()


def _state(request: Request) -> ServiceState:
    return request.app.state.service


@router.get("/healthz", responses=HEALTH_RESPONSES)
async def healthz(request: Request) -> JSONResponse:
    """Liveness: 200 while the process can still serve (starting, ready or draining); 503 once
    the engine died or the start-up failed, so an orchestrator restarts the instance."""
    status = _state(request).status
    if status in _UNHEALTHY:
        return JSONResponse({"status": status}, 503)
    return JSONResponse({"status": "alive"}, 200)


@router.get("/readyz", responses=READY_RESPONSES)
async def readyz(request: Request) -> JSONResponse:
    """200 once the engine is loaded and warmed up; 503 while starting, stopping, failed or dead.
    With the model loaded: its identity, the input budgets its artefact was validated at, the
    budget served, the modes it answers in (two with `MEDTPE_COMPARE_MODES=true`) and how it
    renders records against the artefact's build (`rendering`: whose code descriptions, whether
    they and the renderer's version match the build's, their digest); always the task names and
    the prediction ledger's state (not ready while it cannot be opened)."""
    state = _state(request)
    await state.ledger.open()  # a ledger that could not be opened: tried again (every 2 s)
    status = state.status
    body: dict[str, object] = {"status": status, "tasks": TASK_NAMES}
    if state.failure is not None:
        body["detail"] = state.failure
    body["ledger"] = state.ledger.readiness()
    if state.model is not None:
        body["model"] = asdict(state.model.identity)
        body["validated_budgets"] = list(state.model.bundle.validated_budgets)
        body["max_input_tokens"] = state.model.predictor.max_input_tokens
        body["modes"] = list(state.settings.modes)
        body["rendering"] = asdict(state.model.rendering)
    return JSONResponse(body, 200 if status == "ready" else 503)


@router.get("/metrics", response_class=Response, responses=METRICS_RESPONSES)
async def metrics(request: Request) -> Response:
    """Prometheus exposition of the `medtpe_*` and the engine's `vllm:*` metrics (a bearer
    token of `MEDTPE_API_KEYS` or `MEDTPE_METRICS_KEYS` when either is set, unless
    `MEDTPE_METRICS_PUBLIC=true`; 401 otherwise)."""
    state = _state(request)
    settings = state.settings
    if not settings.metrics_public:
        caller_key(state, request, [*settings.api_keys, *settings.metrics_keys])
    state.publish_status()
    return Response(state.metrics.render(), media_type=state.metrics.content_type)


def attach(app: FastAPI) -> None:
    """Serve `/healthz`, `/readyz` and `/metrics` on the app."""
    app.include_router(router)
