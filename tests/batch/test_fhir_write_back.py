"""Predictions written back to the EHR (`medtpe.fhir_resources.bundles`, `medtpe.batch.write_back`):
every resource valid under `fhir.resources`' R4B models; against a FHIR server of the tests' own
over real HTTP (tests/support/transaction_server.py, SMART Backend Services): a first run creates
one RiskAssessment and one Provenance per prediction in Bundles of bounded size, a rerun creates
nothing, and the token goes to that server only."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import pyarrow.parquet as pq
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from fhir.resources.R4B.bundle import Bundle
from fhir.resources.R4B.device import Device
from fhir.resources.R4B.documentreference import DocumentReference
from fhir.resources.R4B.provenance import Provenance
from fhir.resources.R4B.riskassessment import RiskAssessment

from medtpe.batch.fhir_http import FhirServerError, HttpSettings
from medtpe.batch.fhir_job import FhirShardPlan
from medtpe.batch.job import Request
from medtpe.batch.rows import RecordRow, records_table
from medtpe.batch.smart_backend import ClientKey, public_jwks
from medtpe.batch.task_outputs import records_path
from medtpe.batch.write_back import (
    WRITE_BACK_SCOPE,
    FhirWriter,
    WriteBackError,
    fhir_job_predictions,
    write_back,
)
from medtpe.core.tasks import get_task
from medtpe.core.tokenizer.artefact_manifest import ArtefactBundle
from medtpe.fhir_resources.bundles import (
    AIAST,
    MAX_BUNDLE_ENTRIES,
    PREDICTION_ID_SYSTEM,
    ModelRef,
    WrittenPrediction,
    outcome_concept,
    system_action,
    transaction_bundles,
)
from medtpe.model_card.card import build_model_card, card_digest
from medtpe.model_card.xml import model_card_xml
from tests.support.bulk_server import pem, server_access
from tests.support.paths import DEFAULT_ARTEFACT_ID
from tests.support.transaction_server import TransactionServer, serving_transactions

ROOT = Path(__file__).resolve().parents[2]
CDS_HOOKS_SCHEMA = (
    ROOT / "tests" / "fixtures" / "cds_hooks" / "schemas" / "cds-hooks-2.0.1.schema.json"
)
CLIENT = "medtpe-write-back"
FAST = HttpSettings(default_wait_s=0.01, max_wait_s=0.05, retries=1)
MODEL = ModelRef(
    name="smollm2-135m-instruct",
    mode="medtpe",
    artefact_id=DEFAULT_ARTEFACT_ID,
    product_version="0.1.0",
    card_digest="c" * 64,
    card_url="https://cds.example.org/model-card.xml",
    card_xml=b"<AppliedModelCard/>",
)


def predictions(n: int, task: str = "icu_mortality") -> list[WrittenPrediction]:
    start = datetime(2150, 1, 1, 3, 14)
    return [
        WrittenPrediction(
            prediction_id=f"pred-{task}-{k:04d}",
            patient_id=f"p{k}",
            prediction_time=start + timedelta(hours=k),
            task=get_task(task),
            prediction=k % 2 == 0,
            p_yes=0.5 + k / 100,
            recorded=datetime(2026, 11, 27, 2, 0, tzinfo=UTC),
        )
        for k in range(n)
    ]


@pytest.fixture(scope="module")
def key() -> ClientKey:
    return ClientKey.from_pem(pem(ec.generate_private_key(ec.SECP384R1())))


@pytest.fixture
def server(key: ClientKey) -> Iterator[TransactionServer]:
    fhir = TransactionServer({}, clients={CLIENT: public_jwks(key)}, max_entries=10)
    with serving_transactions(fhir) as served:
        yield served


def test_every_resource_is_valid_r4_with_the_ai_transparency_labels() -> None:
    items = [
        *predictions(3),
        WrittenPrediction(
            "pred-pheno",
            "p9",
            datetime(2150, 1, 2),
            get_task("phenotyping"),
            ["Shock", "Septicemia (except in labor)"],
            None,
            datetime(2026, 11, 27, tzinfo=UTC),
        ),
    ]
    (bundle,) = transaction_bundles(items, MODEL)
    Bundle.model_validate(bundle)
    models = {
        "RiskAssessment": RiskAssessment,
        "Provenance": Provenance,
        "Device": Device,
        "DocumentReference": DocumentReference,
    }
    for entry in bundle["entry"]:
        resource = entry["resource"]
        models[resource["resourceType"]].model_validate(resource)
    risks = [
        e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] == "RiskAssessment"
    ]
    first = risks[0]
    assert first["status"] == "final" and first["subject"] == {"reference": "Patient/p0"}
    assert first["occurrenceDateTime"] == "2150-01-01T03:14:00+00:00"
    assert first["identifier"] == [
        {"system": PREDICTION_ID_SYSTEM, "value": "pred-icu_mortality-0000"}
    ]
    assert first["meta"]["security"] == [AIAST]
    assert first["prediction"][0]["outcome"] == outcome_concept(get_task("icu_mortality"))
    assert first["prediction"][0]["probabilityDecimal"] == 0.5
    assert first["method"]["coding"][0]["code"] == "icu_mortality"
    assert [p["outcome"]["text"] for p in risks[3]["prediction"]] == [
        "Shock",
        "Septicemia (except in labor)",
    ]
    entry = bundle["entry"][2]
    assert entry["request"] == {
        "method": "POST",
        "url": "RiskAssessment",
        "ifNoneExist": f"identifier={PREDICTION_ID_SYSTEM}|pred-icu_mortality-0000",
    }
    provenance = bundle["entry"][3]["resource"]
    assert provenance["target"] == [{"reference": entry["fullUrl"]}]
    assert provenance["agent"][0]["who"]["reference"] == bundle["entry"][0]["fullUrl"]
    assert provenance["entity"][0]["what"]["reference"] == bundle["entry"][1]["fullUrl"]
    # the CDS hook's systemActions create the same RiskAssessment, standing alone
    action = system_action(items[0], MODEL)
    assert action["type"] == "create"
    RiskAssessment.model_validate(action["resource"])
    assert "reference" not in action["resource"]["performer"]
    assert action["resource"]["identifier"] == first["identifier"]
    # a response body of CDS Hooks 2.0.1 (whose schema leaves an action's content open; the
    # specification's Action: type, description, resource for a create)
    cds_hooks = json.loads(CDS_HOOKS_SCHEMA.read_text())
    response = jsonschema.Draft202012Validator(cds_hooks | {"$ref": "#/$defs/response"})
    response.validate({"cards": [], "systemActions": [action]})
    assert set(action) == {"type", "description", "resource"}


def test_bundles_are_bounded() -> None:
    bundles = list(transaction_bundles(predictions(250), MODEL))
    assert [len(b["entry"]) for b in bundles] == [MAX_BUNDLE_ENTRIES, MAX_BUNDLE_ENTRIES, 106]
    with pytest.raises(ValueError, match="room for 4 entries"):
        list(transaction_bundles(predictions(1), MODEL, max_entries=3))


def test_a_first_run_creates_each_prediction_once_and_a_rerun_nothing(
    server: TransactionServer, key: ClientKey, tmp_path: Path
) -> None:
    access = replace(server_access(server, CLIENT, key, tmp_path), scope=WRITE_BACK_SCOPE)
    items = predictions(9)
    first = write_back(access, items, MODEL, settings=FAST, max_entries=6)
    assert first.bundles == 5 and first.predictions == 9
    assert dict(first.created) == {
        "RiskAssessment": 9,
        "Provenance": 9,
        "Device": 1,
        "DocumentReference": 1,
    }
    assert dict(first.existing) == {"Device": 4, "DocumentReference": 4}
    assert len(server.transactions) == 5 and max(server.transactions) <= 6
    risks = server.of_type("RiskAssessment")
    provenances = server.of_type("Provenance")
    (device,) = server.of_type("Device")
    (card,) = server.of_type("DocumentReference")
    assert len(risks) == len(provenances) == 9
    risk_refs = {f"RiskAssessment/{r['id']}" for r in risks}
    for provenance in provenances:  # references rewritten to what the server stored
        Provenance.model_validate(provenance)
        assert provenance["target"][0]["reference"] in risk_refs
        assert provenance["agent"][0]["who"]["reference"] == f"Device/{device['id']}"
        assert provenance["entity"][0]["what"]["reference"] == f"DocumentReference/{card['id']}"
    assert {r["performer"]["reference"] for r in risks} == {f"Device/{device['id']}"}

    again = write_back(access, items, MODEL, settings=FAST, max_entries=6)
    assert dict(again.created) == {}
    assert dict(again.existing) == {
        "RiskAssessment": 9,
        "Provenance": 9,
        "Device": 5,
        "DocumentReference": 5,
    }
    assert len(server.of_type("RiskAssessment")) == len(server.of_type("Provenance")) == 9
    # a later run with two new predictions adds exactly those
    more = write_back(access, predictions(11), MODEL, settings=FAST, max_entries=6)
    assert more.created["RiskAssessment"] == more.created["Provenance"] == 2
    assert len(server.of_type("RiskAssessment")) == 11
    # every transaction carried a valid token
    posts = [r for r in server.requests if r["path"] == "/fhir"]
    assert len(posts) == 5 + 5 + 6 and all(r["token"] for r in posts)


def test_the_token_goes_to_the_fhir_server_only(
    server: TransactionServer, key: ClientKey, tmp_path: Path
) -> None:
    decoy = TransactionServer({}, clients={CLIENT: public_jwks(key)})
    with serving_transactions(decoy):
        server.redirect_to = decoy.base
        access = replace(server_access(server, CLIENT, key, tmp_path), scope=WRITE_BACK_SCOPE)
        with pytest.raises(WriteBackError, match=r"redirect .*not followed"):
            write_back(access, predictions(2), MODEL, settings=FAST)
        assert decoy.requests == []
    assert server.store == {}
    with pytest.raises(FhirServerError, match="is not HTTPS"):
        FhirWriter("http://ehr.example.org/fhir", None)  # type: ignore[arg-type]


def test_the_servers_refusal_is_reported_with_its_operation_outcome(
    server: TransactionServer, key: ClientKey, tmp_path: Path
) -> None:
    access = server_access(server, CLIENT, key, tmp_path)
    with pytest.raises(WriteBackError, match=r"HTTP 403: .*lacks system/Device\.c"):
        write_back(access, predictions(2), MODEL, settings=FAST)  # a token of read scopes
    access = replace(access, scope=WRITE_BACK_SCOPE)
    with pytest.raises(WriteBackError, match="HTTP 400: error: too-costly: more than 10 entries"):
        write_back(access, predictions(6), MODEL, settings=FAST, max_entries=14)
    assert server.store == {}


def test_a_fhir_jobs_answered_records_with_their_patients_and_ledger_rows(tmp_path: Path) -> None:
    task = get_task("icu_mortality")
    when = datetime(2150, 1, 1, 6, 0)

    def row(record: int, prediction: bool | None, p: float | None, error: str | None):
        answered = prediction is not None or p is not None
        return RecordRow(
            record, 900 + record, when, None, prediction, p is not None, p, None, error, 10, 6,
            0.0, f"id-{record}" if answered else None,
        )  # fmt: skip

    rows = [row(0, True, 0.7, None), row(1, None, None, "generate: boom"), row(2, None, 0.4, "x")]
    plan = FhirShardPlan(
        "bucket-00000",
        None,
        tuple(Request(r.record, r.subject_id, when) for r in rows),
        patients=("pa", "pb", "pc"),
    )
    pending = FhirShardPlan("bucket-00001", None, (Request(3, 903, when),), patients=("pd",))
    pq.write_table(records_table(rows), records_path(tmp_path, plan.name))
    at = datetime(2026, 11, 27, tzinfo=UTC)
    asked: list[list[str]] = []

    def ledger(held: dict[str, str]):
        """The ledger's `recorded` of rows `held` (prediction id -> subject)."""

        def recorded(ids):
            asked.append(list(ids))
            return {i: (at, held[i]) for i in ids if i in held}

        return recorded

    found = fhir_job_predictions(
        tmp_path, [plan, pending], task, ledger({"id-0": "pa", "id-2": "pc"})
    )
    written = list(found)
    assert [(w.prediction_id, w.patient_id, w.prediction, w.p_yes) for w in written] == [
        ("id-0", "pa", True, 0.7),
        ("id-2", "pc", None, 0.4),
    ]
    assert {w.recorded for w in written} == {at}
    assert asked == [["id-0", "id-2"]]  # one look-up per shard
    with pytest.raises(ValueError, match="record 2 has no ledger row"):
        list(fhir_job_predictions(tmp_path, [plan], task, ledger({"id-0": "pa"})))
    with pytest.raises(ValueError, match="record 2: its ledger row id-2 is about another patient"):
        list(fhir_job_predictions(tmp_path, [plan], task, ledger({"id-0": "pa", "id-2": "pa"})))


def test_the_card_written_is_the_served_models_card() -> None:
    bundle = ArtefactBundle.from_pretrained(ROOT / "artefacts" / "smollm2-135m-icu")
    card = build_model_card(
        bundle,
        model_name="smollm2-135m-instruct",
        mode="medtpe",
        max_input_tokens=8128,
        tasks=[get_task("icu_mortality")],
        card_url="https://cds.example.org/model-card.xml",
    )
    xml = model_card_xml(card)
    model = ModelRef.of_card(card, xml)
    assert (model.name, model.mode, model.artefact_id) == (
        "smollm2-135m-instruct",
        "medtpe",
        DEFAULT_ARTEFACT_ID,
    )
    (written,) = transaction_bundles(predictions(1), model)
    device, document = (e["resource"] for e in written["entry"][:2])
    assert document["identifier"][0]["value"] == card_digest(card)
    (content,) = document["content"]
    assert content["attachment"]["url"] == "https://cds.example.org/model-card.xml"
    assert base64.b64decode(content["attachment"]["data"]) == xml
    assert device["url"] == "https://cds.example.org/model-card.xml"
    DocumentReference.model_validate(document)


@pytest.mark.parametrize("patient", ["", "p/1", "../Patient/x", "a" * 65, "p 1"])
def test_a_patient_id_that_is_no_fhir_id_is_refused(patient: str) -> None:
    with pytest.raises(ValueError, match="is no FHIR id"):
        replace(predictions(1)[0], patient_id=patient)
