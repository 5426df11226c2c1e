"""CDS Hooks 2.0.1 bodies (pydantic v2): discovery, the hook request, cards, feedback.

Field names are the specification's (camelCase); optional attributes are left out of responses
rather than sent as null or empty (CDS Hooks: "implementers MUST omit it"), so the routes
serialise with `exclude_none`. Requests may carry attributes this version does not define
(a client's extensions): they are ignored.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from medtpe_core.cds.cards import SUMMARY_LIMIT
from medtpe_core.cds.risk import Indicator

Text = Annotated[str, StringConstraints(min_length=1)]
"""A string attribute: CDS Hooks forbids empty ones."""


class _Request(BaseModel):
    """A body a CDS client sends: attributes beyond the specification's are ignored."""

    model_config = ConfigDict(extra="ignore")


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
    prefetch: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _server_with_token(self) -> HookRequest:
        """CDS Hooks: `fhirServer` is required when `fhirAuthorization` is given."""
        if self.fhirAuthorization is not None and self.fhirServer is None:
            raise ValueError("`fhirServer` is required with `fhirAuthorization`")
        return self


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

    @model_validator(mode="after")
    def _behaviour_with_suggestions(self) -> Card:
        """CDS Hooks: `selectionBehavior` must accompany suggestions."""
        if self.suggestions and self.selectionBehavior is None:
            raise ValueError("a card with suggestions needs `selectionBehavior`")
        return self


class CdsResponse(_Response):
    """The answer to a hook call."""

    cards: list[Card]


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
