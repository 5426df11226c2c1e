"""The FastAPI application: the API routes, the CDS Hooks service (`/cds-services`),
`/healthz`, `/readyz`, `/metrics`, the API's description (`/openapi.json`, `/docs`, `/redoc`,
medtpe/service/api_docs/routes.py) and the compression page (`/ui/`, medtpe/service/page/routes.py).
Every log line of the process has its secrets masked (`medtpe.core.secret_masking`, the settings'
keys and URL passwords registered).

The engine starts in the background when the app starts (the prepared model files checked and
loaded, engine start, one warm-up generation), so `/healthz` answers at once and `/readyz` turns
green when the engine can serve; the engine stops when the app stops, after the server has
drained the requests in flight (`medtpe.service.drain`: late ones answered 503 `shutting_down`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from medtpe.core.secret_masking import install_log_masking
from medtpe.inference.engines.factories import start_vllm
from medtpe.inference.engines.protocol import EngineFactory
from medtpe.service.api_docs import routes as api_docs
from medtpe.service.cds_hooks import routes as cds_hooks
from medtpe.service.model_card import routes as model_card
from medtpe.service.page import routes as page
from medtpe.service.plumbing.errors import InternalErrors, install_error_handlers
from medtpe.service.plumbing.limits import BodyLimits
from medtpe.service.plumbing.state import ServiceState
from medtpe.service.predict import routes as predict
from medtpe.service.predict.schemas import API_KEY_SCHEMES, BUDGET
from medtpe.service.probes import routes as probes
from medtpe.service.public_key import routes as public_key
from medtpe.service.settings import ServiceSettings

DOORS = (predict, probes, public_key, model_card, api_docs, cds_hooks, page)
"""Every door of the app (each a package whose `routes.attach(app)` serves it), in the order
they attach."""


def create_app(
    settings: ServiceSettings | None = None,
    engine_factory: EngineFactory = start_vllm,
    salt_secret: bytes | None = None,
    state_key: bytes | None = None,
) -> FastAPI:
    """The service app; the engine (vLLM unless `engine_factory` says otherwise) starts with the
    app, in the background, and stops with it. `salt_secret` keys the callers' cache salts
    (medtpe/service/plumbing/tenancy.py; None: drawn now), `state_key` the score cache's MACs
    without `MEDTPE_STATE_KEY` (`ServiceState.state_key`; None: drawn now)."""
    settings = settings or ServiceSettings()
    install_log_masking(settings.secrets())
    state = ServiceState(settings, engine_factory, salt_secret, state_key)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        starting = asyncio.create_task(state.start())
        try:
            yield
        finally:
            starting.cancel()
            state.stop()
            await app.state.cds_hooks.aclose()
            await state.ledger.close()

    app = FastAPI(
        title="MedTPE prediction service",
        version="0.1.0",
        summary="Clinical predictions from MEDS events with losslessly compressed prompts.",
        lifespan=lifespan,
        openapi_url=None,  # served by medtpe.service.api_docs.routes, behind the API key
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = state
    install_error_handlers(app, state.metrics)
    rejections = state.metrics.rejections
    app.add_middleware(
        BodyLimits,
        max_bytes=settings.max_request_bytes,
        deadline_s=settings.request_timeout_s,
        on_reject=lambda reason: rejections.labels(reason).inc(),
    )
    app.add_middleware(
        InternalErrors,
        on_error=state.metrics.errors.labels("internal").inc,
        on_disconnect=rejections.labels("client_disconnected").inc,
    )
    for door in DOORS:
        door.attach(app)
    app.openapi = partial(_openapi, app, state)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI, state: ServiceState) -> dict[str, Any]:
    """The OpenAPI document with this instance's limits (samples per record, records per batch,
    whether it answers in both modes, once the model is loaded the range of input budgets)
    written into the request schemas, and with API keys configured the two ways to send one,
    so a client generated from it sends what is accepted; kept once it states them all."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(
        title=app.title, version=app.version, summary=app.summary, routes=app.routes
    )
    schemas = document["components"]["schemas"]
    settings = state.settings
    schemas["PredictOptions"]["properties"]["n_samples"]["maximum"] = settings.max_n_samples
    schemas["BatchRequest"]["properties"]["records"]["maxItems"] = settings.capacity
    if not settings.compare_modes:
        schemas["PredictOptions"]["properties"]["both_modes"]["enum"] = [False]
    if settings.api_keys:
        document["components"]["securitySchemes"] = API_KEY_SCHEMES
        for route in predict.router.routes:
            operation = document["paths"][route.path]["post"]  # type: ignore[attr-defined]
            operation["security"] = [{name: []} for name in API_KEY_SCHEMES]
    budgets = state.budget_range
    if budgets is None:
        return document
    for owner in ("PredictOptions", "TokenizeRequest"):
        field = schemas[owner]["properties"][BUDGET]
        number = next(s for s in field.get("anyOf", [field]) if s.get("type") == "integer")
        number["minimum"], number["maximum"] = budgets
    app.openapi_schema = document
    return document
