"""CDS Hooks test material: hook requests as an EHR builds them, from a patient's Bundle.

`prefetch_of` answers a service's prefetch templates from a Bundle the way an EHR's FHIR server
would (the Patient read, one searchset per search, resources in Bundle order), so a test can send
the same record prefetched, or leave keys out for the service to fetch from the test FHIR server
(tests/support/fhir_server.py) holding that Bundle.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from medtpe.core.cds.services import CdsService, render_template
from tests.support.paths import FIXTURES

ICU_BUNDLE = FIXTURES / "cds_hooks" / "icu-patient.json"
ICU_PATIENT = "cds-patient-1"
FHIR_TOKEN = "fhir-access-token-for-tests"


def load_bundle(path: Path = ICU_BUNDLE) -> dict[str, Any]:
    """A Bundle file."""
    return json.loads(path.read_text())


def patient_id(bundle: dict[str, Any]) -> str:
    """The id of the Bundle's Patient."""
    return next(
        e["resource"]["id"] for e in bundle["entry"] if e["resource"]["resourceType"] == "Patient"
    )


def prefetch_of(service: CdsService, bundle: dict[str, Any], patient: str) -> dict[str, Any]:
    """Each prefetch key of `service` answered from `bundle` (read: the resource or null;
    search: a searchset Bundle of the patient's resources of that type, in Bundle order)."""
    context = {"patientId": patient, "encounterId": "icu-stay-1", "userId": "Practitioner/1"}
    resources = [e["resource"] for e in bundle["entry"]]
    answers: dict[str, Any] = {}
    for key, template in service.prefetch.items():
        query = render_template(template, context)
        kind, _, rest = query.partition("?")
        if not rest:
            kind, _, wanted = query.partition("/")
            answers[key] = next(
                (r for r in resources if r["resourceType"] == kind and r["id"] == wanted), None
            )
            continue
        matches = [
            r
            for r in resources
            if r["resourceType"] == kind
            and (r.get("subject") or {}).get("reference") == f"Patient/{patient}"
        ]
        answers[key] = {
            "resourceType": "Bundle",
            "type": "searchset",
            "total": len(matches),
            **({"entry": [{"resource": r} for r in matches]} if matches else {}),
        }
    return answers


def hook_request(
    service: CdsService,
    patient: str,
    *,
    prefetch: dict[str, Any] | None = None,
    fhir_server: str | None = None,
    token: str = FHIR_TOKEN,
) -> dict[str, Any]:
    """A hook call's body for `service` about `patient` (context with user and encounter)."""
    body: dict[str, Any] = {
        "hook": service.hook,
        "hookInstance": str(uuid.uuid4()),
        "context": {"userId": "Practitioner/1", "patientId": patient, "encounterId": "icu-stay-1"},
    }
    if prefetch is not None:
        body["prefetch"] = prefetch
    if fhir_server is not None:
        body["fhirServer"] = fhir_server
        body["fhirAuthorization"] = {
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": 300,
            "scope": "user/Patient.read user/Observation.read",
            "subject": "medtpe-cds",
        }
    return body
