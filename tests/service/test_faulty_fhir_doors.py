"""One rule for faulty FHIR data at every door (docs/integration.md, "Faulty data"): an element
whose own value is faulty (a whitespace-only `valueQuantity.code`, seen in converted MIMIC data)
is left out, named and counted (`medtpe_fhir_elements_dropped_total`), and the patient is
answered with the same prompt through `/predict`'s Bundle, a CDS hook's prefetch and `medtpe
predict --fhir`; a resource the mapping cannot place (an Observation without a time) is a located
422 at both HTTP doors and a counted failure in the batch job. On the instant engine."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from medtpe.batch.fhir_job import FhirInput, run_fhir
from medtpe.batch.job import Job
from medtpe.core.cds.services import get_service
from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
from medtpe.core.meds import MedsDataset
from medtpe.core.tasks import get_task
from medtpe.inference.sampling import Sampling
from medtpe.service.settings import ServiceSettings
from tests.batch.test_fhir_job import RecordingEngine, patient_id
from tests.support.bulk_server import resources_by_type, write_export
from tests.support.cds_support import hook_request, prefetch_of
from tests.support.ehr import Ehr
from tests.support.mimic_fhir_fixture import FIXTURE
from tests.support.service_support import (
    SERVICE_API_KEY,
    instant_client,
    instant_settings,
    metric_value,
    own_ledger_environment,
)

ICU = get_service("medtpe-icu-mortality-patient-view")
TASK = get_task("icu_mortality")
BASE = "http://testserver"

own_ledger = pytest.fixture(scope="module", autouse=True)(own_ledger_environment)
"""The module's batch runs record to a ledger of their own, signed with the test key."""


@pytest.fixture(scope="module")
def settings(service_files: tuple[Path, Path], ehr: Ehr) -> ServiceSettings:
    return instant_settings(
        service_files, max_request_bytes=32 * 1024 * 1024, **ehr.service_settings(BASE)
    )


@pytest.fixture(scope="module")
def client(settings: ServiceSettings) -> Iterator[TestClient]:
    with instant_client(settings) as client:
        yield client


def faulty_bundle(fault: str) -> tuple[dict[str, Any], int]:
    """The fixture's first stay as a Bundle with its newest Observation given `fault` (`blank
    unit`: a whitespace-only `valueQuantity.code`; `no time`: no `effectiveDateTime`), and that
    Observation's entry index."""
    dataset = MedsDataset.load(FIXTURE)
    bundle = copy.deepcopy(fhir_bundle_from_meds(dataset.events(dataset.subject_ids[0])))
    index, newest = max(
        (
            (i, e["resource"])
            for i, e in enumerate(bundle["entry"])
            if e["resource"]["resourceType"] == "Observation" and "valueQuantity" in e["resource"]
        ),
        key=lambda pair: pair[1]["effectiveDateTime"],
    )
    if fault == "blank unit":
        newest["valueQuantity"]["code"] = " \t "
    else:
        newest.pop("effectiveDateTime")
    return bundle, index


def through_every_door(
    client: TestClient, settings: ServiceSettings, ehr: Ehr, bundle: dict, out: Path
) -> tuple[Any, Any, dict[str, Any], list[str]]:
    """(the `/predict` answer, the hook's answer, the batch job's summary, its issues' lines);
    the prompts each engine got are in `client`'s engine and `RecordingEngine.made`."""
    predicted = client.post(
        "/predict",
        json={"task": TASK.name, "bundle": bundle},
        headers={"Authorization": f"Bearer {SERVICE_API_KEY}"},
    )
    patient = patient_id(bundle)
    url = f"/cds-services/{ICU.id}"
    body = hook_request(ICU, patient, prefetch=prefetch_of(ICU, bundle, patient))
    hooked = client.post(url, json=body, headers=ehr.authorization(BASE + url))
    export = write_export(resources_by_type([bundle]), out / "export")
    RecordingEngine.made.clear()
    job = Job(
        meds_dir=out, task=TASK, times=(None,), sampling=Sampling(max_new_tokens=8), concurrency=1
    )
    summary = run_fhir(
        settings.model(), job, FhirInput((export,)), out / "out", engine_factory=RecordingEngine
    )
    issues = (out / "out" / "fhir_issues.ndjson").read_text().splitlines()
    return predicted, hooked, summary, issues


def test_a_faulty_element_is_left_out_the_same_at_every_door(
    client: TestClient, settings: ServiceSettings, ehr: Ehr, tmp_path: Path
) -> None:
    bundle, index = faulty_bundle("blank unit")
    app_engine = client.app.state.service.engine
    predicted, hooked, summary, issues = through_every_door(client, settings, ehr, bundle, tmp_path)
    assert predicted.status_code == 200, predicted.text
    by_predict = app_engine.prompts[-2]
    mapping = predicted.json()["fhir"]
    (warning,) = mapping["warnings"]
    assert warning["loc"] == ["entry", index, "resource", "valueQuantity", "code"]
    assert mapping["counts"]["Observation"]["dropped_elements"] == 1
    assert hooked.status_code == 200, hooked.text
    assert app_engine.prompts[-1] == by_predict
    metrics = client.get("/metrics", headers={"Authorization": f"Bearer {SERVICE_API_KEY}"}).text
    dropped = "medtpe_fhir_elements_dropped_total"
    assert metric_value(metrics, dropped, task=TASK.name, site="api") >= 1
    assert metric_value(metrics, dropped, task=TASK.name, site=ICU.id) >= 1
    assert summary["records"] == 1 and summary["failures"] == 0
    (engine,) = RecordingEngine.made
    assert engine.prompts == [by_predict]
    (issue,) = [json.loads(line) for line in issues]
    assert "valueQuantity.code" in issue["reason"] and "left out" in issue["reason"]


def test_a_resource_the_mapping_cannot_place_is_located_at_every_door(
    client: TestClient, settings: ServiceSettings, ehr: Ehr, tmp_path: Path
) -> None:
    bundle, index = faulty_bundle("no time")
    predicted, hooked, summary, issues = through_every_door(client, settings, ehr, bundle, tmp_path)
    assert predicted.status_code == 422, predicted.text
    (detail,) = predicted.json()["detail"]
    assert detail["loc"] == ["body", "bundle", "entry", index, "resource", "effectiveDateTime"]
    assert hooked.status_code == 422, hooked.text
    assert "effectiveDateTime" in json.dumps(hooked.json()["detail"])
    assert summary["records"] == 1 and summary["failures"] == 1
    assert any("effectiveDateTime" in json.loads(line)["reason"] for line in issues)
