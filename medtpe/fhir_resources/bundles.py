"""FHIR R4 resources of predictions written back to the EHR, as plain JSON dicts (pure
functions): one RiskAssessment per prediction with its Provenance, the model as a Device and the
model card as a DocumentReference, after HL7's AI Transparency on FHIR guide (AIAST security
label; AIProvenance: the model as the agent, the card as an entity; AIDevice; AIModelCard), in
transaction Bundles of bounded size.

A rerun writes nothing twice: the RiskAssessment is a conditional create on its identifier (the
prediction id of the receipt: `If-None-Exist: identifier=urn:medtpe:prediction-id|<id>`, the
id escaped as FHIR search values are and percent-encoded: `search_value`); the
Device and the DocumentReference likewise on theirs (model and artefact; the card's digest); the
Provenance, which R4 gives no identifier, is an update-as-create (`PUT Provenance/<id>`) at an id
derived from the prediction id. References inside a Bundle are `urn:uuid:` full URLs derived from
the same ids, which the server replaces by the resources it created or found.
"""

from __future__ import annotations

import base64
import hashlib
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from medtpe.core.tasks import Prediction, Task
from medtpe.model_card.card import card_digest

PREDICTION_ID_SYSTEM = "urn:medtpe:prediction-id"
"""The identifier system of a written RiskAssessment (value: the receipt's prediction id)."""
MODEL_SYSTEM = "urn:medtpe:model"
"""The identifier system of the model's Device (value: `name/mode/artefact_id`)."""
MODEL_CARD_SYSTEM = "urn:medtpe:model-card"
"""The identifier system of the model card's DocumentReference (value: the card's digest)."""
TASK_SYSTEM = "urn:medtpe:task"
"""The code system of the product's tasks (code: the task's name)."""
OBSERVATION_VALUE = "http://terminology.hl7.org/CodeSystem/v3-ObservationValue"
AIAST = {
    "system": OBSERVATION_VALUE,
    "code": "AIAST",
    "display": "Artificial Intelligence asserted",
}
"""The AI Transparency IG's security label: the content was asserted by an AI."""
AI_IG = "http://hl7.org/fhir/uv/aitransparency"
AI_PROVENANCE_PROFILE = f"{AI_IG}/StructureDefinition/AI-Provenance"
AI_DEVICE_PROFILE = f"{AI_IG}/StructureDefinition/AI-Device"
AI_MODEL_CARD_PROFILE = f"{AI_IG}/StructureDefinition/AI-ModelCard"
AI_DEVICE_TYPE = {
    "system": f"{AI_IG}/CodeSystem/AIdeviceTypeCS",
    "code": "Artificial-Intelligence",
    "display": "Artificial Intelligence",
}
AI_KIND_EXTENSION = f"{AI_IG}/StructureDefinition/aitransparency.AIKind"
MODEL_CARD_EXTENSION = f"{AI_IG}/StructureDefinition/aitransparency.modelCardDescription"
AI_INPUTS = f"{AI_IG}/CodeSystem/AIinputsCS"
PARTICIPANT_TYPE = "http://terminology.hl7.org/CodeSystem/provenance-participant-type"
ENTITY_ROLE_DERIVATION = "derivation"
DATA_OPERATION = "http://terminology.hl7.org/CodeSystem/v3-DataOperation"
SNOMED = "http://snomed.info/sct"
TASK_OUTCOMES: Mapping[str, Mapping[str, str]] = {
    "icu_mortality": {"system": SNOMED, "code": "419620001", "display": "Death (event)"},
    "readmission_30d": {"system": SNOMED, "code": "417005", "display": "Hospital re-admission"},
    "pancreatic_cancer_1y": {
        "system": SNOMED,
        "code": "363418001",
        "display": "Malignant tumor of pancreas",
    },
}
"""SNOMED CT codes of the built-in binary tasks' outcomes (beside the task's own code)."""
MAX_BUNDLE_ENTRIES = 200
"""The most entries of one transaction Bundle: the Device, the card and 99 predictions (each a
RiskAssessment and its Provenance)."""
SHARED_ENTRIES = 2
"""Entries every Bundle repeats (the Device and the card's DocumentReference)."""
FHIR_ID_CHARS = 64
FHIR_ID = re.compile(r"[A-Za-z0-9\-.]{1,64}")
"""A FHIR resource id (R4 `id`)."""
SEARCH_ESCAPED = re.compile(r"([\\,$|])")
"""The characters FHIR R4 escapes with a backslash in a search parameter's value (search.html,
"Escaping Search Parameters")."""
QUERY_SAFE = ":/"
"""Characters left as they are when a search value is percent-encoded into a query (besides
letters, digits and `_.-~`): the systems' `urn:` and the model identifier's `name/mode/id`."""


@dataclass(frozen=True)
class ModelRef:
    """The model that answered (the Device) and its card (the DocumentReference)."""

    name: str
    mode: str
    artefact_id: str
    product_version: str
    card_digest: str
    """sha256 of the card's canonical JSON (`medtpe.model_card.card.card_digest`)."""
    card_url: str | None = None
    """Where the card is published (`GET /model-card.xml`)."""
    card_xml: bytes | None = None
    """The card's CHAI XML, attached to the DocumentReference (None: only its URL)."""

    @classmethod
    def of_card(cls, card: Mapping[str, Any], xml: bytes | None = None) -> ModelRef:
        """The model a card (`medtpe.model_card.card.build_model_card`) describes, with the card's
        digest, URL and (`xml`) its CHAI XML to attach."""
        facts = card["facts"]
        return cls(
            name=facts["model"],
            mode=facts["mode"],
            artefact_id=facts["artefact_id"],
            product_version=facts["product_version"],
            card_digest=card_digest(card),
            card_url=card.get("url"),
            card_xml=xml,
        )

    @property
    def identifier(self) -> str:
        """The Device's identifier value."""
        return f"{self.name}/{self.mode}/{self.artefact_id}"


@dataclass(frozen=True)
class WrittenPrediction:
    """One prediction to write back."""

    prediction_id: str
    """The receipt's prediction id (the RiskAssessment's identifier)."""
    patient_id: str
    """The FHIR Patient's id at the server written to."""
    prediction_time: datetime
    task: Task
    prediction: Prediction | None
    p_yes: float | None
    """p("yes") where computed (binary tasks)."""
    recorded: datetime
    """When the answer was computed (the ledger row's time)."""

    def __post_init__(self) -> None:
        if not FHIR_ID.fullmatch(self.patient_id):
            raise ValueError(f"patient_id {self.patient_id[:80]!r} is no FHIR id")
        if not self.prediction_id:
            raise ValueError("prediction_id is empty")


def _instant(when: datetime) -> str:
    """A FHIR instant/dateTime (UTC when the time is naive, as MEDS times are)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.isoformat()


def _uuid_of(*parts: str) -> str:
    """A `urn:uuid:` full URL derived from `parts` (the same inputs give the same URL)."""
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, '|'.join(parts))}"


def provenance_id(prediction_id: str) -> str:
    """The Provenance's id for a prediction: a FHIR id (`[A-Za-z0-9.-]{1,64}`) derived from it."""
    return "medtpe-" + hashlib.sha256(prediction_id.encode()).hexdigest()[: FHIR_ID_CHARS - 7]


def outcome_concept(task: Task) -> dict[str, Any]:
    """The task's outcome as a CodeableConcept: the product's task code, and a SNOMED CT code
    for the built-in binary tasks."""
    codings = [{"system": TASK_SYSTEM, "code": task.name, "display": task.title}]
    if task.name in TASK_OUTCOMES:
        codings.append(dict(TASK_OUTCOMES[task.name]))
    return {"coding": codings, "text": task.question}


def _predictions(item: WrittenPrediction) -> list[dict[str, Any]]:
    task, answer = item.task, item.prediction
    if task.label_type == "binary":
        entry: dict[str, Any] = {"outcome": outcome_concept(task)}
        if item.p_yes is not None:
            entry["probabilityDecimal"] = round(float(item.p_yes), 6)
        if answer is not None:
            entry["rationale"] = f"Model answer: {'yes' if answer else 'no'}"
        return [entry]
    chosen = [answer] if isinstance(answer, str) else list(answer or [])
    system = f"{TASK_SYSTEM}:{task.name}"
    return [
        {
            "outcome": {"coding": [{"system": system, "code": label}], "text": label},
            "rationale": f"Model answer: {label} applies",
        }
        for label in chosen
    ]


def risk_assessment(
    item: WrittenPrediction, model: ModelRef, device_url: str | None = None
) -> dict[str, Any]:
    """The RiskAssessment of one prediction (status final, the patient, the prediction time,
    the task and model as `method`, the model's Device as `performer` (`device_url`; None: named
    only), one `prediction` per outcome (a multilabel task: per label answered), the prediction
    id as identifier, the AIAST label)."""
    resource: dict[str, Any] = {
        "resourceType": "RiskAssessment",
        "meta": {"security": [dict(AIAST)]},
        "identifier": [{"system": PREDICTION_ID_SYSTEM, "value": item.prediction_id}],
        "status": "final",
        "method": {
            "coding": [{"system": TASK_SYSTEM, "code": item.task.name, "display": item.task.title}],
            "text": f"MedTPE {item.task.title} · {model.name} ({model.mode}, artefact "
            f"{model.artefact_id})",
        },
        "code": outcome_concept(item.task),
        "subject": {"reference": f"Patient/{item.patient_id}"},
        "occurrenceDateTime": _instant(item.prediction_time),
        "performer": {"display": f"MedTPE · {model.name}"},
    }
    if device_url is not None:
        resource["performer"]["reference"] = device_url
    predictions = _predictions(item)
    if predictions:
        resource["prediction"] = predictions
    return resource


def provenance(
    item: WrittenPrediction, target_url: str, device_url: str, card_url: str, model: ModelRef
) -> dict[str, Any]:
    """The AIProvenance of one RiskAssessment: the target, when it was computed, the model's
    Device as the author agent, the model card as a derivation entity, reason AIAST."""
    return {
        "resourceType": "Provenance",
        "id": provenance_id(item.prediction_id),
        "meta": {"profile": [AI_PROVENANCE_PROFILE], "security": [dict(AIAST)]},
        "target": [{"reference": target_url}],
        "occurredDateTime": _instant(item.recorded),
        "recorded": _instant(item.recorded),
        "reason": [{"coding": [dict(AIAST)]}],
        "activity": {"coding": [{"system": DATA_OPERATION, "code": "CREATE", "display": "create"}]},
        "agent": [
            {
                "type": {"coding": [{"system": PARTICIPANT_TYPE, "code": "author"}]},
                "role": [{"coding": [dict(AI_DEVICE_TYPE)]}],
                "who": {"reference": device_url, "display": f"MedTPE · {model.name}"},
            }
        ],
        "entity": [
            {
                "role": ENTITY_ROLE_DERIVATION,
                "what": {"reference": card_url, "display": "Model card (CHAI Applied Model Card)"},
            }
        ],
    }


def device(model: ModelRef, card_url: str) -> dict[str, Any]:
    """The model as an AIDevice: its identifier, name, versions and card."""
    resource: dict[str, Any] = {
        "resourceType": "Device",
        "meta": {"profile": [AI_DEVICE_PROFILE]},
        "extension": [
            {
                "url": AI_KIND_EXTENSION,
                "valueCodeableConcept": {
                    "coding": [
                        {
                            **AI_DEVICE_TYPE,
                            "code": "Large-Language-Models",
                            "display": "Large Language Models",
                        }
                    ]
                },
            },
            {"url": MODEL_CARD_EXTENSION, "valueReference": {"reference": card_url}},
        ],
        "identifier": [{"system": MODEL_SYSTEM, "value": model.identifier}],
        "status": "active",
        "manufacturer": "MedTPE",
        "deviceName": [{"name": f"MedTPE · {model.name} ({model.mode})", "type": "model-name"}],
        "type": {"coding": [dict(AI_DEVICE_TYPE)]},
        "version": [
            {"type": {"text": "medtpe"}, "value": model.product_version},
            {"type": {"text": "artefact"}, "value": model.artefact_id},
        ],
    }
    if model.card_url:
        resource["url"] = model.card_url
    return resource


def model_card_document(model: ModelRef) -> dict[str, Any]:
    """The model card as an AIModelCard DocumentReference (CHAI format: the XML attached and/or
    its URL), identified by the card's digest."""
    attachment: dict[str, Any] = {"contentType": "application/xml", "title": "Model card"}
    if model.card_url:
        attachment["url"] = model.card_url
    if model.card_xml is not None:
        attachment["data"] = base64.b64encode(model.card_xml).decode()
    return {
        "resourceType": "DocumentReference",
        "meta": {"profile": [AI_MODEL_CARD_PROFILE]},
        "identifier": [{"system": MODEL_CARD_SYSTEM, "value": model.card_digest}],
        "status": "current",
        "type": {"coding": [{"system": AI_INPUTS, "code": "AIModelCard"}]},
        "category": [
            {
                "coding": [
                    {"system": AI_INPUTS, "code": "AImodelCardCHAIformat", "display": "CHAI Format"}
                ]
            }
        ],
        "description": f"Model card of MedTPE · {model.name} ({model.mode}), artefact "
        f"{model.artefact_id}",
        "content": [{"attachment": attachment}],
    }


def search_value(text: str) -> str:
    """`text` as one part of a search parameter's value in a query: `\\ , $ |` escaped with a
    backslash (FHIR R4's search escaping), then percent-encoded (`&`, `+`, `%`, `#`, spaces...)."""
    return quote(SEARCH_ESCAPED.sub(r"\\\1", text), safe=QUERY_SAFE)


def identifier_search(system: str, value: str) -> str:
    """The `If-None-Exist` query that finds the resource with identifier `system|value`."""
    return f"identifier={search_value(system)}|{search_value(value)}"


def _conditional(resource: dict[str, Any], full_url: str, system: str) -> dict[str, Any]:
    value = resource["identifier"][0]["value"]
    return {
        "fullUrl": full_url,
        "resource": resource,
        "request": {
            "method": "POST",
            "url": resource["resourceType"],
            "ifNoneExist": identifier_search(system, value),
        },
    }


def transaction_bundle(
    items: Sequence[WrittenPrediction], model: ModelRef, max_entries: int = MAX_BUNDLE_ENTRIES
) -> dict[str, Any]:
    """One transaction Bundle: the Device and the card's DocumentReference (conditional
    creates), then each prediction's RiskAssessment (conditional create) and Provenance
    (update as create); `ValueError` beyond `max_entries` entries."""
    if SHARED_ENTRIES + 2 * len(items) > max_entries:
        raise ValueError(f"{len(items)} predictions exceed a Bundle of {max_entries} entries")
    device_url = _uuid_of(MODEL_SYSTEM, model.identifier)
    card_url = _uuid_of(MODEL_CARD_SYSTEM, model.card_digest)
    entries = [
        _conditional(device(model, card_url), device_url, MODEL_SYSTEM),
        _conditional(model_card_document(model), card_url, MODEL_CARD_SYSTEM),
    ]
    for item in items:
        target_url = _uuid_of(PREDICTION_ID_SYSTEM, item.prediction_id)
        entries.append(
            _conditional(risk_assessment(item, model, device_url), target_url, PREDICTION_ID_SYSTEM)
        )
        prov = provenance(item, target_url, device_url, card_url, model)
        entries.append(
            {
                "fullUrl": _uuid_of("Provenance", prov["id"]),
                "resource": prov,
                "request": {"method": "PUT", "url": f"Provenance/{prov['id']}"},
            }
        )
    return {"resourceType": "Bundle", "type": "transaction", "entry": entries}


def transaction_bundles(
    items: Sequence[WrittenPrediction], model: ModelRef, max_entries: int = MAX_BUNDLE_ENTRIES
) -> Iterator[dict[str, Any]]:
    """`items` in transaction Bundles of at most `max_entries` entries each (at least 4)."""
    if max_entries < SHARED_ENTRIES + 2:
        raise ValueError(f"a Bundle needs room for {SHARED_ENTRIES + 2} entries")
    per_bundle = (max_entries - SHARED_ENTRIES) // 2
    for start in range(0, len(items), per_bundle):
        yield transaction_bundle(items[start : start + per_bundle], model, max_entries)


def system_action(item: WrittenPrediction, model: ModelRef) -> dict[str, Any]:
    """A CDS Hooks `systemActions` entry that has the EHR create the prediction's RiskAssessment
    (the model named as performer, no Device reference: the action stands alone)."""
    return {
        "type": "create",
        "description": f"Record the MedTPE {item.task.title} risk assessment",
        "resource": risk_assessment(item, model),
    }
