"""The FastAPI application: the API routes plus `/healthz`, `/readyz` and `/metrics`.

The engine starts in the background when the app starts (model preparation, export, engine start,
one warm-up generation), so `/healthz` answers at once and `/readyz` turns green when the engine
can serve; the engine stops when the app stops, after uvicorn has drained the requests in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from inference.engine import EngineFactory, start_vllm
from service.errors import install_error_handlers
from service.limits import BodySizeLimit
from service.routes import api_router
from service.settings import ServiceSettings
from service.state import ServiceState


def create_app(
    settings: ServiceSettings | None = None, engine_factory: EngineFactory = start_vllm
) -> FastAPI:
    """The service app; the engine (vLLM unless `engine_factory` says otherwise) starts with the
    app, in the background, and stops with it."""
    state = ServiceState(settings or ServiceSettings(), engine_factory)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        starting = asyncio.create_task(state.start())
        try:
            yield
        finally:
            starting.cancel()
            state.stop()

    app = FastAPI(
        title="MedTPE prediction service",
        version="0.1.0",
        summary="Clinical predictions from MEDS events with losslessly compressed prompts.",
        lifespan=lifespan,
    )
    app.state.service = state
    install_error_handlers(app, state.metrics)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=state.settings.max_request_bytes,
        on_reject=state.metrics.rejections.labels("too_large").inc,
    )
    app.include_router(api_router())

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """Liveness: 200 while the process can still serve (starting or ready); 503 once the
        engine died or the start-up failed, so an orchestrator restarts the instance."""
        status = state.status
        if status in ("failed", "engine_dead"):
            return JSONResponse({"status": status}, 503)
        return JSONResponse({"status": "alive"}, 200)

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """200 once the engine is loaded and warmed up; 503 while starting, failed or dead."""
        status = state.status
        state.metrics.engine_ready.set(1 if status == "ready" else 0)
        body: dict[str, object] = {"status": status}
        if state.failure is not None:
            body["detail"] = state.failure
        if state.model is not None:
            body["model"] = vars(state.model.identity)
        return JSONResponse(body, 200 if status == "ready" else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus exposition of the `medtpe_*` metrics."""
        state.metrics.engine_ready.set(1 if state.status == "ready" else 0)
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    return app
