"""CDS Hooks 2.0.1 bodies (pydantic v2): discovery, the hook request, cards, feedback.

Field names are the specification's (camelCase); optional attributes are left out of responses
rather than sent as null or empty (CDS Hooks: "implementers MUST omit it"), so the routes
serialise with `exclude_none`. Requests may carry attributes this version does not define
(a client's extensions): they are ignored.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from fastapi.exceptions import RequestValidationError
from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from medtpe.core.cds.cards import SUMMARY_LIMIT
from medtpe.core.cds.risk import Indicator
from medtpe.service.plumbing.json_body import UnreadableBody, require_utf8, strict_loads

Text = Annotated[str, StringConstraints(min_length=1)]
"""A string attribute: CDS Hooks forbids empty ones."""


class _Request(BaseModel):
    """A body a CDS client sends: attributes beyond the specification's are ignored."""

    model_config = ConfigDict(extra="ignore")


Body = TypeVar("Body", bound=_Request)


class _Response(BaseModel):
    """A body this service sends."""

    model_config = ConfigDict(extra="forbid")


class Coding(_Response):
    """A CDS Hooks Coding (`display` required where a service offers it)."""

    code: Text
    system: Text | None = None
    display: Text | None = None


class ServiceDescription(_Response):
    """One entry of the discovery response."""

    hook: Text
    title: Text | None = None
    description: Text
    id: Text
    prefetch: dict[str, Text] | None = None
    usageRequirements: Text | None = None


class DiscoveryResponse(_Response):
    """`GET /cds-services`."""

    services: list[ServiceDescription]


class FhirAuthorization(_Request):
    """The bearer token a CDS client hands the service for its FHIR server (never logged)."""

    access_token: Text
    token_type: Literal["Bearer"]
    expires_in: int = Field(ge=0)
    scope: Text
    subject: Text
    patient: Text | None = None


class HookRequest(_Request):
    """`POST /cds-services/{id}`: the hook's context and, optionally, prefetched data or a FHIR
    server to fetch it from."""

    hook: Text
    hookInstance: Text
    fhirServer: AnyHttpUrl | None = None
    fhirAuthorization: FhirAuthorization | None = None
    context: dict[str, Any]
    prefetch: dict[str, bytes] | None = None
    """Each prefetch key's value as the JSON text the client sent (`read_hook_request`)."""

    @model_validator(mode="after")
    def _server_with_token(self) -> HookRequest:
        """CDS Hooks: `fhirServer` is required when `fhirAuthorization` is given."""
        if self.fhirAuthorization is not None and self.fhirServer is None:
            raise ValueError("`fhirServer` is required with `fhirAuthorization`")
        return self


_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_PREFETCH = msgspec.json.Decoder(dict[str, msgspec.Raw] | None)
PREFETCH = "prefetch"
FEEDBACK = "feedback"


def read_hook_request(body: bytes) -> HookRequest:
    """The hook request in a request body, each prefetch value kept as the JSON text sent: a
    long record's prefetch is megabytes, and decoding it into Python objects costs more than
    the rest of a cached call (`medtpe.core.fhir` reads each resource from its text, once). A
    `RequestValidationError` locating the field (`["body", ...]`) otherwise, text that is no
    JSON this service reads (not UTF-8, malformed, nested too deeply) included."""
    try:
        require_utf8(body)
        try:
            members = _MEMBERS.decode(body)
        except (msgspec.DecodeError, RecursionError):  # not an object (pydantic says what it
            return _validated(HookRequest, strict_loads(body))  # is), or no JSON (located)
        fields = {
            name: strict_loads(value, (name,))
            for name, value in members.items()
            if name != PREFETCH
        }
        if PREFETCH in members:
            fields[PREFETCH] = _prefetch(members[PREFETCH])
    except UnreadableBody as exc:
        raise exc.validation_error() from None
    return _validated(HookRequest, fields)


def _prefetch(raw: msgspec.Raw) -> object:
    """The prefetch member: each key's value as its JSON text, else (not an object) as decoded,
    for pydantic to name."""
    try:
        prefetch = _PREFETCH.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return strict_loads(raw, (PREFETCH,))
    return None if prefetch is None else {key: bytes(value) for key, value in prefetch.items()}


def read_feedback(body: bytes, max_items: int) -> FeedbackRequest:
    """The feedback request in a request body (read after the JWT check), else a
    `RequestValidationError` locating what is wrong: more than `max_items` items at
    `["body", "feedback"]`, counted before any item is validated."""
    try:
        data = strict_loads(body)
    except UnreadableBody as exc:
        raise exc.validation_error() from None
    items = data.get(FEEDBACK) if isinstance(data, dict) else None
    if isinstance(items, list) and len(items) > max_items:
        message = f"at most {max_items} feedback items per call (MEDTPE_CDS_MAX_FEEDBACK_ITEMS)"
        error = {"type": "too_long", "loc": ("body", FEEDBACK), "msg": message}
        raise RequestValidationError([error])
    return _validated(FeedbackRequest, data)


def _validated(model: type[Body], data: object) -> Body:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        raise RequestValidationError(errors) from None


class Source(_Response):
    """Where a card's guidance comes from: the model, with a link to its model card."""

    label: Text
    url: AnyHttpUrl | None = None
    icon: AnyHttpUrl | None = None
    topic: Coding | None = None


class Suggestion(_Response):
    """A choice offered on a card; this service's only one acknowledges the score (no action),
    so that accepting it reaches the feedback endpoint."""

    label: Text
    uuid: Text
    isRecommended: bool | None = None


class Card(_Response):
    """One card (CDS Hooks 2.0.1: summary under 140 characters, Markdown detail)."""

    uuid: Text
    summary: Annotated[str, StringConstraints(min_length=1, max_length=SUMMARY_LIMIT - 1)]
    detail: Text | None = None
    indicator: Indicator
    source: Source
    suggestions: list[Suggestion] | None = None
    selectionBehavior: Literal["at-most-one", "any"] | None = None
    overrideReasons: list[Coding] | None = None
    extension: dict[str, Any] | None = None
    """`prediction_id` (also the card's `uuid`) and the signed `receipt` of the prediction the
    card shows (docs/integration.md); none with the ledger off."""

    @model_validator(mode="after")
    def _behaviour_with_suggestions(self) -> Card:
        """CDS Hooks: `selectionBehavior` must accompany suggestions."""
        if self.suggestions and self.selectionBehavior is None:
            raise ValueError("a card with suggestions needs `selectionBehavior`")
        return self


class CdsResponse(_Response):
    """The answer to a hook call."""

    cards: list[Card]
    systemActions: list[dict[str, Any]] | None = None
    """With `MEDTPE_CDS_SYSTEM_ACTIONS`: a `create` of the card's answer as a FHIR
    RiskAssessment (`medtpe.service.cds_hooks.system_actions`)."""


class FeedbackOutcome(StrEnum):
    """What the user did with a card."""

    ACCEPTED = "accepted"
    OVERRIDDEN = "overridden"


class AcceptedSuggestion(_Request):
    """A suggestion the user accepted (on this service's cards: the acknowledgement)."""

    id: Text


class OverrideReason(_Request):
    """Why the user overrode a card."""

    reason: dict[str, Any] | None = None
    userComment: str | None = None


class Feedback(_Request):
    """One outcome of one card."""

    card: Text
    outcome: FeedbackOutcome
    acceptedSuggestions: list[AcceptedSuggestion] | None = None
    overrideReason: OverrideReason | None = None
    outcomeTimestamp: datetime

    @model_validator(mode="after")
    def _accepted_names_suggestions(self) -> Feedback:
        """CDS Hooks: `acceptedSuggestions` is required for `accepted` outcomes."""
        if self.outcome is FeedbackOutcome.ACCEPTED and not self.acceptedSuggestions:
            raise ValueError("an `accepted` outcome needs `acceptedSuggestions`")
        return self


class FeedbackRequest(_Request):
    """`POST /cds-services/{id}/feedback`."""

    feedback: list[Feedback] = Field(min_length=1)
