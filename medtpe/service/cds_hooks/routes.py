"""`/cds-services`: discovery, hook calls and feedback (CDS Hooks 2.0.1).

Every call, discovery included, carries the EHR's JWT (`medtpe.service.cds_hooks.jwt_auth`), checked
before anything else (the body is read after it); a failed check is a bare 401. The API keys of
`/predict` play no part here. These routes are left out of the OpenAPI document: their contract
is the CDS Hooks specification (tests/fixtures/cds_hooks holds its JSON schemas).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.responses import Response

from medtpe.core.cds.services import SERVICES, CdsService, UnknownServiceError, get_service
from medtpe.ledger.feedback import FeedbackRow, UnrecordedPredictions
from medtpe.service.cds_hooks.audit import AuditEntry, audited, write
from medtpe.service.cds_hooks.hook_call import CdsHooks, answer_hook
from medtpe.service.cds_hooks.jwt_auth import Caller, HookUnauthorized
from medtpe.service.cds_hooks.responses import discovery
from medtpe.service.cds_hooks.schemas import (
    CdsResponse,
    DiscoveryResponse,
    Feedback,
    read_feedback,
    read_hook_request,
)
from medtpe.service.cds_hooks.state_store import StateUnavailable, state_unavailable
from medtpe.service.plumbing.errors import ApiError, field_error
from medtpe.service.plumbing.state import ServiceState

logger = logging.getLogger("medtpe.service")
UNKNOWN = "unknown"
"""The service label of a call naming no service of the discovery list."""
UNKNOWN_CARD = "unknown_card"
NOT_IN_LEDGER = "card_not_in_ledger"
UNRECORDED = (
    "the ledger holds no prediction of this card (issued while the ledger was off, or recorded "
    "in another ledger): its feedback cannot be kept; do not send it again"
)


def _state(request: Request) -> ServiceState:
    return request.app.state.service


def _hooks(request: Request) -> CdsHooks:
    return request.app.state.cds_hooks


StateDep = Annotated[ServiceState, Depends(_state)]
HooksDep = Annotated[CdsHooks, Depends(_hooks)]


async def _caller(
    request: Request,
    state: StateDep,
    hooks: HooksDep,
    authorization: Annotated[str | None, Header()] = None,
) -> Caller:
    """The EHR that signed the call, else `HookUnauthorized` (a bare 401); a replay check whose
    store did not answer is a 503 (audited)."""
    try:
        return await hooks.auth.verify(authorization, hooks.audience(request))
    except ApiError as exc:
        entry = AuditEntry(_named_service(request), outcome="error", reason=exc.error)
        write(entry, state.metrics)
        raise


def _named_service(request: Request) -> str:
    """The service id a `/cds-services` path names, for the audit line (`discovery`, or
    `unknown` for no such service)."""
    named = request.url.path.removeprefix("/cds-services").strip("/").split("/")[0]
    known = {s.id for s in SERVICES}
    return named if named in known else ("discovery" if not named else UNKNOWN)


CallerDep = Annotated[Caller, Depends(_caller)]

router = APIRouter(prefix="/cds-services", include_in_schema=False)


def _service(service_id: str) -> CdsService:
    """The service of the discovery list the path names, else 404 (audited, not counted: a
    path is never a metric label)."""
    try:
        return get_service(service_id)
    except UnknownServiceError as exc:
        write(AuditEntry(UNKNOWN, outcome="invalid", reason="not_found"), None)
        detail = field_error(["path", "service_id"], str(exc), "not_found")
        raise ApiError(404, "not_found", detail) from None


@router.get("", response_model=DiscoveryResponse, response_model_exclude_none=True)
async def discover(caller: CallerDep, state: StateDep) -> DiscoveryResponse:
    """The services: one per hook and task (or tasks), with their prefetch templates."""
    return discovery(state.settings)


@router.post("/{service_id}", response_model=CdsResponse, response_model_exclude_none=True)
async def call(
    service_id: str, request: Request, state: StateDep, hooks: HooksDep, caller: CallerDep
) -> CdsResponse:
    """A hook call: one risk card per task of the service for the patient in context (the body
    is read after the JWT check, its prefetch kept as JSON text: `read_hook_request`)."""
    service = _service(service_id)
    body = read_hook_request(await request.body())
    entry = AuditEntry(service.id, hookInstance=body.hookInstance, issuer=caller.issuer)
    entry.tenant, entry.jti = caller.tenant, caller.jti
    with audited(entry, state.metrics):
        return await answer_hook(state, hooks, service, body, caller, entry)


@router.post("/{service_id}/feedback")
async def feedback(
    service_id: str, request: Request, state: StateDep, hooks: HooksDep, caller: CallerDep
) -> Response:
    """Record what the user did with cards (in the ledger's `feedback` table, committed before
    the answer: a 503 `ledger_unavailable` when it cannot be, so the EHR sends it again; counted
    per outcome in `/metrics`; the body is read after the JWT check): at most
    `MEDTPE_CDS_MAX_FEEDBACK_ITEMS` items, each about a card this service issued to the caller
    (`IssuedCards`) whose prediction the ledger holds; otherwise nothing is recorded nor counted
    per outcome and the answer is a 422 naming each item's card that was not (`unknown_card`,
    `card_not_in_ledger`: a card issued while the ledger was off)."""
    service = _service(service_id)
    body = read_feedback(await request.body(), state.settings.cds_max_feedback_items)
    cards = [item.card for item in body.feedback]
    try:
        unknown = await hooks.cards.unknown((caller.issuer, caller.tenant or ""), service.id, cards)
    except StateUnavailable:
        raise state_unavailable("the issued cards' store did not answer") from None
    if unknown:
        message = f"no card of {service.id} issued to this caller within MEDTPE_CDS_CARD_TTL_S"
        raise _refused(state, service, caller, unknown, UNKNOWN_CARD, message)
    try:
        await state.ledger.commit_feedback(feedback_rows(body.feedback, caller))  # else a 503
    except UnrecordedPredictions as exc:
        logger.warning(
            "CDS feedback refused: %d card(s) of %s without a prediction in the ledger",
            len(exc.indices),
            service.id,
        )
        raise _refused(state, service, caller, exc.indices, NOT_IN_LEDGER, UNRECORDED) from None
    for item in body.feedback:
        entry = AuditEntry(service.id, event="feedback", issuer=caller.issuer, card=item.card)
        entry.tenant, entry.jti, entry.outcome = caller.tenant, caller.jti, item.outcome.value
        write(entry, state.metrics)
        state.metrics.cds_feedback.labels(service.id, item.outcome.value).inc()
    return Response(status_code=200)


def feedback_rows(items: list[Feedback], caller: Caller) -> list[FeedbackRow]:
    """The ledger's rows of feedback items: a card's uuid is its prediction's id; an override's
    reason is its coding's code (else the user's comment)."""
    received = datetime.now(UTC).replace(tzinfo=None)
    rows = []
    for item in items:
        override = item.overrideReason
        reason = None
        if override is not None:
            reason = (override.reason or {}).get("code") or override.userComment
        rows.append(
            FeedbackRow(
                card_uuid=item.card,
                prediction_id=item.card,
                issuer=caller.issuer,
                outcome=item.outcome.value,
                override_reason=None if reason is None else str(reason),
                outcome_time=item.outcomeTimestamp.astimezone(UTC).replace(tzinfo=None),
                received_at=received,
            )
        )
    return rows


def _refused(
    state: ServiceState,
    service: CdsService,
    caller: Caller,
    items: list[int],
    reason: str,
    message: str,
) -> ApiError:
    """The 422 of a feedback call refused whole, naming the card of each item in `items`; its
    one audit line written (reason, no card) and counted as an invalid request."""
    entry = AuditEntry(service.id, event="feedback", issuer=caller.issuer, jti=caller.jti)
    entry.tenant, entry.outcome, entry.reason = caller.tenant, "invalid", reason
    write(entry, state.metrics)
    state.metrics.rejections.labels("invalid").inc()
    detail = [
        error
        for i in items
        for error in field_error(("body", "feedback", i, "card"), message, reason)
    ]
    return ApiError(422, "invalid_request", detail)


def attach(app: FastAPI) -> None:
    """Mount `/cds-services` and its 401 handler on the app (its `ServiceState` at
    `app.state.service`)."""
    state: ServiceState = app.state.service
    app.state.cds_hooks = CdsHooks.from_settings(
        state.settings,
        state.state_key,
        lambda operation: state.metrics.state_failures.labels(operation).inc(),
        lambda reason: state.metrics.score_entries_refused.labels(reason).inc(),
    )
    if not state.settings.cds_issuers:
        logger.warning("CDS Hooks: no issuer allowed (MEDTPE_CDS_ISSUERS): every call gets 401")

    @app.exception_handler(HookUnauthorized)
    async def _unauthorized(request: Request, exc: HookUnauthorized) -> Response:
        entry = AuditEntry(_named_service(request), jti=exc.jti, outcome="unauthorized")
        entry.reason = exc.reason
        write(entry, state.metrics)
        state.metrics.rejections.labels("unauthorized").inc()
        return Response(status_code=401, headers={"WWW-Authenticate": "Bearer"})

    app.include_router(router)
