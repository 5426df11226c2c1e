"""CDS Hooks response bodies: the discovery document and the risk card."""

from __future__ import annotations

import uuid

from inference.model import ModelIdentity
from medtpe_core.cds.cards import CardText
from medtpe_core.cds.services import SERVICES
from service.cds_hooks.schemas import (
    Card,
    Coding,
    DiscoveryResponse,
    ServiceDescription,
    Source,
    Suggestion,
)
from service.settings import ServiceSettings

OVERRIDE_SYSTEM = "urn:medtpe:cds-hooks:override-reason"
OVERRIDE_REASONS = (
    Coding(code="not-relevant", system=OVERRIDE_SYSTEM, display="Not relevant to this patient now"),
    Coding(code="data-incomplete", system=OVERRIDE_SYSTEM, display="The record used is incomplete"),
    Coding(code="disagree", system=OVERRIDE_SYSTEM, display="Clinical judgement differs"),
)
"""The reasons a clinician may give when dismissing a card (reported back as feedback)."""
ACKNOWLEDGE = "Acknowledge this risk score"


def discovery() -> DiscoveryResponse:
    """`GET /cds-services`: every service with its hook and prefetch templates."""
    return DiscoveryResponse(
        services=[
            ServiceDescription(
                hook=s.hook,
                title=s.title,
                description=s.description,
                id=s.id,
                prefetch=dict(s.prefetch),
            )
            for s in SERVICES
        ]
    )


def risk_card(text: CardText, identity: ModelIdentity, settings: ServiceSettings) -> Card:
    """A card from its text: a fresh uuid, the model as source (linked to its model card), an
    acknowledgement to accept and the reasons to override it."""
    return Card(
        uuid=str(uuid.uuid4()),
        summary=text.summary,
        detail=text.detail,
        indicator=text.indicator,
        source=Source(label=f"MedTPE · {identity.name}", url=settings.cds_model_card_url),
        suggestions=[Suggestion(label=ACKNOWLEDGE, uuid=str(uuid.uuid4()))],
        selectionBehavior="at-most-one",
        overrideReasons=list(OVERRIDE_REASONS),
    )
