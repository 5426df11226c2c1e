"""The `systemActions` of a hook response (`MEDTPE_CDS_SYSTEM_ACTIONS`): the call's answer as
the FHIR RiskAssessment `medtpe predict --write-back` writes (`medtpe.fhir_resources.bundles`), for
the EHR to create, identified by the call's ledger row. Off by default: an EHR that applies system
actions writes them to the chart without anyone's click."""

from __future__ import annotations

import json
from typing import Any

from medtpe.core.cds.services import PATIENT_ID
from medtpe.core.tasks import Task
from medtpe.fhir_resources.bundles import FHIR_ID, WrittenPrediction, system_action
from medtpe.ledger.store import PredictionRow
from medtpe.service.cds_hooks.schemas import HookRequest
from medtpe.service.model_card.routes import served_model
from medtpe.service.plumbing.errors import ApiError, field_error
from medtpe.service.plumbing.state import ServiceState


def check_patient_id(body: HookRequest) -> None:
    """The context's patient id is a FHIR id (a RiskAssessment's subject): 422 otherwise."""
    if not FHIR_ID.fullmatch(str(body.context[PATIENT_ID])):
        raise ApiError(
            422,
            "invalid_request",
            field_error(
                ("body", "context", PATIENT_ID),
                "is no FHIR resource id ([A-Za-z0-9.-], at most 64): no RiskAssessment can "
                "name it as subject",
                "fhir_id",
            ),
        )


def risk_assessment_actions(
    state: ServiceState, task: Task, patient_id: str, row: PredictionRow
) -> list[dict[str, Any]]:
    """One `create` of the RiskAssessment of the answer `row` records about `patient_id`: the
    row's prediction id as identifier, its p("yes"), its prediction time."""
    model = served_model(state)
    if model is None or row.prediction_time is None:
        return []
    item = WrittenPrediction(
        prediction_id=row.prediction_id,
        patient_id=patient_id,
        prediction_time=row.prediction_time,
        task=task,
        prediction=json.loads(row.answer),
        p_yes=row.p_yes,
        recorded=row.created_at,
    )
    return [system_action(item, model)]
