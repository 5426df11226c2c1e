"""A CDS hook's answer as a `systemActions` create (`MEDTPE_CDS_SYSTEM_ACTIONS`), on the instant
engine in-process: the response is a CDS Hooks 2.0.1 response body, its RiskAssessment valid
R4B and the one `medtpe predict --write-back` writes, identified by the call's ledger row; a
card from the score cache carries none; off by default; a patient id that is no FHIR id is a 422
naming it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fhir.resources.R4B.riskassessment import RiskAssessment
from pydantic import ValidationError
from starlette.testclient import TestClient

from medtpe.core.cds.services import get_service
from medtpe.core.tasks import get_task
from medtpe.fhir_resources.bundles import AIAST, PREDICTION_ID_SYSTEM, outcome_concept
from medtpe.ledger.store import Ledger
from medtpe.service.settings import ServiceSettings
from tests.support.cds_support import ICU_PATIENT, hook_request, load_bundle, prefetch_of
from tests.support.ehr import Ehr
from tests.support.paths import FIXTURES
from tests.support.service_support import instant_client, instant_settings

ICU = get_service("medtpe-icu-mortality-patient-view")
BASE = "http://testserver"
FHIR_SERVER = "https://fhir.hospital.test.invalid/r4"
SCHEMA = FIXTURES / "cds_hooks" / "schemas" / "cds-hooks-2.0.1.schema.json"


def settings(service_files: tuple[Path, Path], ehr: Ehr, tmp: Path, **changes: Any):
    return instant_settings(
        service_files,
        cds_issuers=json.loads(ehr.issuers_setting([FHIR_SERVER])),
        cds_base_url=BASE,
        ledger_url=f"sqlite:///{tmp / 'ledger.sqlite3'}",
        **changes,
    )


@pytest.fixture(scope="module")
def ledger_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ledger")


@pytest.fixture(scope="module")
def client(service_files: tuple[Path, Path], ehr: Ehr, ledger_dir: Path) -> Iterator[TestClient]:
    on = settings(service_files, ehr, ledger_dir, cds_system_actions=True)
    with instant_client(on) as client:
        yield client


def call(client: TestClient, ehr: Ehr, patient: str = ICU_PATIENT) -> Any:
    body = hook_request(ICU, patient, prefetch=prefetch_of(ICU, load_bundle(), ICU_PATIENT))
    url = f"/cds-services/{ICU.id}"
    return client.post(url, json=body, headers=ehr.authorization(BASE + url))


def response_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA.read_text())
    return jsonschema.Draft202012Validator(
        schema | {"$ref": "#/$defs/response"},
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )


def test_a_computed_card_comes_with_its_risk_assessment_to_create(
    client: TestClient, ehr: Ehr, ledger_dir: Path
) -> None:
    client.app.state.cds_hooks.scores.store.clear()
    answer = call(client, ehr)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    response_validator().validate(body)
    (card,) = body["cards"]
    (action,) = body["systemActions"]
    assert action["type"] == "create" and set(action) == {"type", "description", "resource"}
    risk = action["resource"]
    RiskAssessment.model_validate(risk)
    ledger = Ledger.open(f"sqlite:///{ledger_dir / 'ledger.sqlite3'}")
    try:
        row = ledger.get(card["extension"]["prediction_id"])
    finally:
        ledger.close()
    assert row is not None and row.door == "cds_hook"
    assert risk["identifier"] == [{"system": PREDICTION_ID_SYSTEM, "value": row.prediction_id}]
    assert risk["subject"] == {"reference": f"Patient/{ICU_PATIENT}"}
    assert risk["meta"]["security"] == [AIAST]
    assert risk["status"] == "final" and "reference" not in risk["performer"]
    (prediction,) = risk["prediction"]
    assert prediction["outcome"] == outcome_concept(get_task("icu_mortality"))
    # the instant engine puts p(yes) at 0.75, as the card and the row say
    assert prediction["probabilityDecimal"] == round(row.p_yes, 6) == 0.75
    assert "**Probability:** 0.75" in card["detail"]
    assert risk["occurrenceDateTime"].startswith(row.prediction_time.isoformat())

    # the same call again: the card from the score cache, no second RiskAssessment
    again = call(client, ehr)
    assert again.status_code == 200, again.text
    assert "systemActions" not in again.json()
    response_validator().validate(again.json())


def test_a_patient_id_that_is_no_fhir_id_is_refused_naming_it(client: TestClient, ehr: Ehr) -> None:
    answer = call(client, ehr, patient="../Patient/1")
    assert answer.status_code == 422, answer.text
    (error,) = answer.json()["detail"]
    assert error["loc"] == ["body", "context", "patientId"] and error["type"] == "fhir_id"


def test_off_by_default_and_refused_without_the_ledger(
    service_files: tuple[Path, Path], ehr: Ehr, tmp_path: Path
) -> None:
    off = settings(service_files, ehr, tmp_path)
    assert off.cds_system_actions is False
    with instant_client(off) as client:
        answer = call(client, ehr)
        assert answer.status_code == 200, answer.text
        assert "systemActions" not in answer.json()
    with pytest.raises(ValidationError, match=r"MEDTPE_CDS_SYSTEM_ACTIONS=true .*LEDGER_OFF"):
        ServiceSettings(cds_system_actions=True, ledger_off=True)
