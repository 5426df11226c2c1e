"""The CDS services this package offers, one per task and hook, with their prefetch templates.

Each service names a CDS Hooks 2.0 hook, the MedTPE task it predicts and its prefetch templates
(key → FHIR query). The templates keep to the query subset CDS Hooks recommends (instance reads
and type-level searches on the patient reference; no modifiers, no chained or `_include`
searches), so any CDS client can satisfy them; the service fetches a template's data itself when
the client leaves its key out (`render_template` fills the context tokens).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote

PATIENT_VIEW = "patient-view"
ENCOUNTER_START = "encounter-start"
ENCOUNTER_DISCHARGE = "encounter-discharge"

PATIENT_ID = "patientId"
ENCOUNTER_ID = "encounterId"
USER_ID = "userId"

HOOK_CONTEXT: Mapping[str, tuple[str, ...]] = {
    PATIENT_VIEW: (USER_ID, PATIENT_ID),
    ENCOUNTER_START: (USER_ID, PATIENT_ID, ENCOUNTER_ID),
    ENCOUNTER_DISCHARGE: (USER_ID, PATIENT_ID, ENCOUNTER_ID),
}
"""The context fields each hook requires (CDS Hooks hook library, v1.0 of each hook)."""

PATIENT_RECORD: Mapping[str, str] = {
    "patient": "Patient/{{context.patientId}}",
    "encounters": "Encounter?patient={{context.patientId}}",
    "observations": "Observation?patient={{context.patientId}}",
    "conditions": "Condition?patient={{context.patientId}}",
    "medicationAdministrations": "MedicationAdministration?patient={{context.patientId}}",
    "medicationRequests": "MedicationRequest?patient={{context.patientId}}",
    "procedures": "Procedure?patient={{context.patientId}}",
}
"""Prefetch templates of a patient's whole record: the resource types the FHIR → MEDS mapping
reads (`medtpe/core/fhir`), each a plain search on the patient reference."""


@dataclass(frozen=True)
class CdsService:
    """One CDS service: the hook that calls it, the task it predicts, what it asks to prefetch."""

    id: str
    hook: str
    task: str
    title: str
    description: str
    prefetch: Mapping[str, str] = field(default_factory=lambda: dict(PATIENT_RECORD))


SERVICES: tuple[CdsService, ...] = (
    CdsService(
        id="medtpe-icu-mortality-patient-view",
        hook=PATIENT_VIEW,
        task="icu_mortality",
        title="ICU mortality risk (MedTPE)",
        description="Risk that the patient dies during the current ICU stay, predicted by an "
        "open LLM from the patient's FHIR record when the chart is opened.",
    ),
    CdsService(
        id="medtpe-icu-mortality-encounter-start",
        hook=ENCOUNTER_START,
        task="icu_mortality",
        title="ICU mortality risk at admission (MedTPE)",
        description="Risk that the patient dies during the ICU stay, predicted by an open LLM "
        "from the patient's FHIR record when the encounter starts.",
    ),
    CdsService(
        id="medtpe-readmission-30d-encounter-discharge",
        hook=ENCOUNTER_DISCHARGE,
        task="readmission_30d",
        title="30-day readmission risk (MedTPE)",
        description="Risk that the patient is readmitted to hospital within 30 days, predicted "
        "by an open LLM from the patient's FHIR record at discharge.",
    ),
)


class UnknownServiceError(LookupError):
    """No CDS service has that id."""


def get_service(service_id: str) -> CdsService:
    """The service with this id, else `UnknownServiceError`.

    >>> get_service("medtpe-readmission-30d-encounter-discharge").task
    'readmission_30d'
    """
    for service in SERVICES:
        if service.id == service_id:
            return service
    raise UnknownServiceError(f"no CDS service {service_id!r}")


_TOKEN = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")


class TemplateError(ValueError):
    """A prefetch template names a token the request's context does not give."""

    def __init__(self, token: str) -> None:
        super().__init__(f"the context gives no value for the prefetch token {{{{{token}}}}}")
        self.token = token


def render_template(
    template: str, context: Mapping[str, object], *, url_encoded: bool = False
) -> str:
    """The FHIR query of a prefetch template: each `{{context.FIELD}}` replaced by that
    root-level, primitive context field (CDS Hooks: only those are tokens). With `url_encoded`
    each value is percent-encoded (`url_value`), so no value changes the query's structure.

    >>> render_template("Observation?patient={{context.patientId}}", {"patientId": "12"})
    'Observation?patient=12'
    >>> render_template("Patient/{{context.patientId}}", {"patientId": "../1"}, url_encoded=True)
    'Patient/..%2F1'
    """

    def value(match: re.Match[str]) -> str:
        token = match.group(1)
        name = token.removeprefix("context.")
        found = context.get(name) if token.startswith("context.") else None
        if not isinstance(found, str | int | float) or isinstance(found, bool) or found == "":
            raise TemplateError(token)
        return url_value(str(found)) if url_encoded else str(found)

    return _TOKEN.sub(value, template)


def url_value(text: str) -> str:
    """`text` as one URL path segment or query value: every character but the unreserved ones
    percent-encoded (no `/`, `?`, `&`, `=` or `#` of its own), and a value of dots only (`..`,
    a path step) as `%2E`s.

    >>> url_value("12&_include=*#x"), url_value("..")
    ('12%26_include%3D%2A%23x', '%2E%2E')
    """
    if not text.strip("."):
        return text.replace(".", "%2E")
    return quote(text, safe="")
