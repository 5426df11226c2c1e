"""CDS Hooks response bodies: the discovery document and the risk card."""

from __future__ import annotations

import uuid

from medtpe.core.cds.cards import CardText
from medtpe.core.cds.services import SERVICES, CdsService
from medtpe.core.tasks import get_task
from medtpe.inference.model import ModelIdentity
from medtpe.ledger.store import PredictionRow
from medtpe.service.cds_hooks.schemas import (
    Card,
    Coding,
    DiscoveryResponse,
    ServiceDescription,
    Source,
    Suggestion,
)
from medtpe.service.model_card.routes import CARD_PATH
from medtpe.service.plumbing.receipts import receipt_body
from medtpe.service.settings import ServiceSettings

OVERRIDE_SYSTEM = "urn:medtpe:cds-hooks:override-reason"
OVERRIDE_REASONS = (
    Coding(code="not-relevant", system=OVERRIDE_SYSTEM, display="Not relevant to this patient now"),
    Coding(code="data-incomplete", system=OVERRIDE_SYSTEM, display="The record used is incomplete"),
    Coding(code="disagree", system=OVERRIDE_SYSTEM, display="Clinical judgement differs"),
)
"""The reasons a clinician may give when dismissing a card (reported back as feedback)."""
ACKNOWLEDGE = "Acknowledge this risk score"


def discovery(settings: ServiceSettings) -> DiscoveryResponse:
    """`GET /cds-services`: every service with its hook and prefetch templates; the description
    of a service whose tasks `MEDTPE_CDS_SERVICE_TASKS` sets names them (one card each)."""
    return DiscoveryResponse(
        services=[
            ServiceDescription(
                hook=s.hook,
                title=s.title,
                description=service_description(s, settings.cds_tasks(s)),
                id=s.id,
                prefetch=dict(s.prefetch),
            )
            for s in SERVICES
        ]
    )


def service_description(service: CdsService, tasks: tuple[str, ...]) -> str:
    """The discovery description of `service` predicting `tasks`: its own, and when the tasks
    are not just its own, the cards a call gets."""
    if tasks == (service.task,):
        return service.description
    titles = "; ".join(get_task(name).title for name in tasks)
    return f"{service.description} One card per task, from one read of the record: {titles}."


def risk_card(
    text: CardText,
    identity: ModelIdentity,
    settings: ServiceSettings,
    prediction: PredictionRow | None = None,
) -> Card:
    """A card from its text: the model as source (linked to its model card), an acknowledgement
    to accept and the reasons to override it; with the `prediction`'s ledger row, that row's id
    as the card's uuid (feedback names it) and in `extension` with the signed receipt, else a
    fresh uuid."""
    extension = None
    if prediction is not None:
        receipt = receipt_body(prediction).model_dump()
        extension = {"prediction_id": prediction.prediction_id, "receipt": receipt}
    return Card(
        uuid=prediction.prediction_id if prediction is not None else str(uuid.uuid4()),
        summary=text.summary,
        detail=text.detail,
        indicator=text.indicator,
        source=Source(label=f"MedTPE · {identity.name}", url=model_card_url(settings)),
        suggestions=[Suggestion(label=ACKNOWLEDGE, uuid=str(uuid.uuid4()))],
        selectionBehavior="at-most-one",
        overrideReasons=list(OVERRIDE_REASONS),
        extension=extension,
    )


def model_card_url(settings: ServiceSettings) -> str | None:
    """The model card a card's source names: `MEDTPE_CDS_MODEL_CARD_URL`, else the service's
    own `/model-card.xml` under `MEDTPE_CDS_BASE_URL` (None without either)."""
    if settings.cds_model_card_url is not None:
        return str(settings.cds_model_card_url)
    if settings.cds_base_url is None:
        return None
    return f"{str(settings.cds_base_url).rstrip('/')}{CARD_PATH}"
