"""The API's description: `/openapi.json` and its two viewers, `/docs` (Swagger UI) and `/redoc`.

With `MEDTPE_API_KEYS` set they need a key, as the API does (401 otherwise), unless
`MEDTPE_PUBLIC_DOCS=true`; a viewer in a browser sends no key, so an instance whose viewers are
read in a browser sets that.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from medtpe.service.predict.routes import caller_key

OPENAPI_PATH = "/openapi.json"


def _key_unless_public(request: Request) -> None:
    """A 401 without a valid API key, unless the description is public or keys are off."""
    state = request.app.state.service
    if not state.settings.public_docs:
        caller_key(state, request)


router = APIRouter(include_in_schema=False, dependencies=[Depends(_key_unless_public)])


@router.get(OPENAPI_PATH)
async def openapi(request: Request) -> JSONResponse:
    """The OpenAPI document (`medtpe.service.app` writes this instance's limits into it)."""
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI over the document."""
    return get_swagger_ui_html(openapi_url=OPENAPI_PATH, title=f"{request.app.title} - docs")


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    """ReDoc over the document."""
    return get_redoc_html(openapi_url=OPENAPI_PATH, title=f"{request.app.title} - ReDoc")


def attach(app: FastAPI) -> None:
    """Serve the document and its viewers (the app is created without FastAPI's own)."""
    app.include_router(router)
