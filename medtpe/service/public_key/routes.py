"""`GET /ledger/public-key`: the Ed25519 public key (a JWK, RFC 8037) that checks the receipts'
signatures. Always open, like `/readyz`: a public key is public by design, and whoever holds a
receipt must be able to check it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

PUBLIC_KEY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The signing key's public half as a JWK (`kty` OKP, `crv` Ed25519, `x`, "
        "`kid`: the receipts' `key_id`).",
        "content": {"application/json": {"schema": {"type": "object"}}},
    },
    404: {
        "description": "The ledger is off (`MEDTPE_LEDGER_OFF=true`): answers carry no receipt.",
        "content": {"application/json": {"schema": {"type": "object"}}},
    },
}
router = APIRouter()


@router.get("/ledger/public-key", responses=PUBLIC_KEY_RESPONSES)
async def public_key(request: Request) -> JSONResponse:
    """The public key of the receipts' signatures (a JWK)."""
    signer = request.app.state.service.ledger.signer
    if signer is None:
        return JSONResponse(
            {"error": "ledger_off", "detail": "the ledger is off: answers carry no receipt"}, 404
        )
    return JSONResponse(signer.jwk())


def attach(app: FastAPI) -> None:
    """Serve `/ledger/public-key` on the app."""
    app.include_router(router)
