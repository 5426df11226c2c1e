"""The compression page: static files (`medtpe/service/page/static/`: one HTML page, a script, a
style sheet, bundled example records) served at `/ui/`, with `/` and `/ui` redirecting there.

The page itself needs no API key; every API call it makes sends the key its user typed in (kept
in the page's memory only). It calls the public API only, so it shows what any client gets. Its
Content-Security-Policy allows nothing but this origin: no CDN, no inline script, no framing.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC_DIR = Path(__file__).with_name("static")
UI_PATH = "/ui"
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
"""Headers of every file of the page."""

router = APIRouter(include_in_schema=False)


@router.get("/")
async def root() -> RedirectResponse:
    """The service's root leads to the page."""
    return RedirectResponse(f"{UI_PATH}/")


class _PageFiles(StaticFiles):
    """The page's files with `PAGE_HEADERS`."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        """The file at `path` (`index.html` for the directory), with the page's headers."""
        response = await super().get_response(path, scope)
        response.headers.update(PAGE_HEADERS)
        return response


def attach(app: FastAPI) -> None:
    """Serve the page at `/ui/` (`/ui` and `/` redirect there)."""
    app.include_router(router)
    app.mount(UI_PATH, _PageFiles(directory=STATIC_DIR, html=True), name="ui")
