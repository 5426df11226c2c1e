"""The generated model card (`medtpe.model_card.card`, `medtpe.model_card.xml`): built from the
default artefact's manifest, build and evaluation reports and the tasks; its XML form valid against
CHAI's published Applied Model Card schema (v0.2, tests/fixtures/chai); the known risk (the
default model does not discriminate) derived from the recorded figures; the routes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import xmlschema
from fastapi import FastAPI
from fastapi.testclient import TestClient

from medtpe.core.tasks import get_task, list_tasks
from medtpe.core.tokenizer.artefact_manifest import ArtefactBundle
from medtpe.model_card.card import (
    EVALUATION_FILE,
    build_model_card,
    card_digest,
    write_evaluation_report,
)
from medtpe.model_card.xml import model_card_xml
from medtpe.service.model_card.routes import router
from tests.support.paths import DEFAULT_ARTEFACT_ID

ROOT = Path(__file__).resolve().parents[2]
ARTEFACT = ROOT / "artefacts" / "smollm2-135m-icu"
CHAI_XSD = ROOT / "tests" / "fixtures" / "chai" / "schema-v0.2.xsd"
DSIG = "http://www.w3.org/2000/09/xmldsig#"
DSIG_XSD = Path(xmlschema.__file__).parent / "schemas" / "DSIG" / "xmldsig-core-schema.xsd"
EVALUATION_RUNS = [
    (Path("tools/benchmarks/results/eval_all_stays_1024_record_first_rescored.json"), "2026-11-29"),
    (Path("tools/benchmarks/results/eval_held_out_4096_rescored.json"), "2026-11-29"),
]
"""The stored runs the default artefact's evaluation report is written from, with their dates
(docs/benchmarks.md, Evaluation: clinical metrics)."""


@pytest.fixture(scope="module")
def chai_schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(CHAI_XSD), locations={DSIG: str(DSIG_XSD)}, allow="local")


@pytest.fixture(scope="module")
def bundle() -> ArtefactBundle:
    return ArtefactBundle.from_pretrained(ARTEFACT)


def card_of(bundle: ArtefactBundle, budget: int = 8128) -> dict:
    return build_model_card(
        bundle,
        model_name="smollm2-135m-instruct",
        mode="medtpe",
        max_input_tokens=budget,
        tasks=[get_task(name) for name in list_tasks()],
        card_url="https://cds.example.org/model-card.xml",
    )


def test_the_card_comes_from_the_artefact_and_its_reports(bundle: ArtefactBundle) -> None:
    card = card_of(bundle)
    sections = list(card["card"])
    assert sections == [
        "BasicInfo",
        "ReleaseInfo",
        "ModelSummary",
        "UsesAndDirections",
        "Warnings",
        "TrustIngredients",
        "KeyMetrics",
        "Resources",
        "Bibliography",
    ]
    facts = card["facts"]
    manifest = json.loads((ARTEFACT / "manifest.json").read_text())
    assert facts["artefact_id"] == manifest["artefact_id"] == DEFAULT_ARTEFACT_ID
    assert facts["content_digest"] == manifest["content_digest"]
    assert facts["validated_budgets"] == [4096, 8192] and facts["budget_validated"]
    assert [t["name"] for t in facts["tasks"]] == list_tasks()
    assert {s["file"] for s in facts["sources"]} == {
        "manifest.json",
        "build_report.json",
        EVALUATION_FILE,
    }
    # the gate's figures with their records, at each validated budget
    safety = card["card"]["KeyMetrics"]["SafetyReliability"]["Results"]["MetricResult"]
    labels = [r["Label"] for r in safety]
    assert any("8192 tokens (15 answered windows, 2026-11-29)" in label for label in labels)
    delta = json.loads(safety[1]["ValueJson"])
    assert delta["kind"] == "estimate_ci"
    assert delta["estimate"] == round(manifest["validated"]["4096"]["delta_p_mean"]["value"], 4)
    # the same inputs give the same card (its digest identifies it)
    assert card_digest(card) == card_digest(card_of(bundle))
    assert card["card"]["ReleaseInfo"]["ReleaseDate"] == "2026-11-29"


def test_the_default_model_is_said_not_to_discriminate_with_its_figures(
    bundle: ArtefactBundle,
) -> None:
    risks = card_of(bundle)["card"]["Warnings"]["KnownRisksAndLimitations"]
    assert (
        "**smollm2-135m-instruct does not discriminate icu_mortality** (original mode): AUROC "
        "0.51 [0.27, 0.74] on 93 records of 63 patients (9 positive), 2026-11-29"
    ) in risks
    useful = card_of(bundle)["card"]["KeyMetrics"]["UsefulnessUsabilityEfficacy"]
    assert "93 records of 63 patients (9 positive)" in useful["TestingDataDescription"]


def test_a_budget_above_the_validated_ones_is_a_known_risk(bundle: ArtefactBundle) -> None:
    card = card_of(bundle, budget=16384)
    assert not card["facts"]["budget_validated"]
    assert "(16384 tokens) is above" in card["card"]["Warnings"]["KnownRisksAndLimitations"]


def test_the_xml_is_valid_against_chais_schema(
    bundle: ArtefactBundle, chai_schema: xmlschema.XMLSchema, tmp_path: Path
) -> None:
    xml = model_card_xml(card_of(bundle))
    assert xml.startswith(b"<?xml") and b'xmlns="https://mc.chai.org/v0.2/schema.xsd"' in xml
    chai_schema.validate(xml.decode())
    # the validator is not lenient: a card without its Warnings is refused
    broken = card_of(bundle)
    del broken["card"]["Warnings"]
    with pytest.raises(xmlschema.XMLSchemaValidationError):
        chai_schema.validate(model_card_xml(broken).decode())
    # an artefact with no reports still gives a valid card (figures said to be missing)
    bare = tmp_path / "bare"
    shutil.copytree(ARTEFACT, bare)
    for name in ("build_report.json", EVALUATION_FILE):
        (bare / name).unlink()
    card = card_of(ArtefactBundle.from_pretrained(bare))
    chai_schema.validate(model_card_xml(card).decode())
    useful = card["card"]["KeyMetrics"]["UsefulnessUsabilityEfficacy"]["Results"]
    assert useful["MetricResult"][0]["Label"] == "clinical evaluation: none measured"


def test_the_committed_evaluation_report_is_the_one_the_stored_runs_give(tmp_path: Path) -> None:
    runs = [(ROOT / path, date) for path, date in EVALUATION_RUNS]
    written = write_evaluation_report(tmp_path, "2026-11-29", runs)
    regenerated = json.loads(written.read_text())
    for entry in regenerated["evaluations"]:
        entry["source"] = Path(entry["source"]).relative_to(ROOT).as_posix()
    assert regenerated == json.loads((ARTEFACT / EVALUATION_FILE).read_text())


def test_the_routes_serve_the_loaded_models_card(
    instant_api: TestClient, chai_schema: xmlschema.XMLSchema
) -> None:
    instant_api.app.include_router(router)
    card = instant_api.get("/model-card")
    assert card.status_code == 200
    facts = card.json()["facts"]
    ready = instant_api.get("/readyz").json()
    assert facts["artefact_id"] == ready["model"]["artefact_id"]
    assert facts["max_input_tokens"] == ready["max_input_tokens"]
    xml = instant_api.get("/model-card.xml")
    assert xml.status_code == 200 and xml.headers["content-type"] == "application/xml"
    chai_schema.validate(xml.text)


def test_before_a_model_is_loaded_the_card_is_a_503() -> None:
    app = FastAPI()
    app.include_router(router)
    app.state.service = SimpleNamespace(model=None)
    with TestClient(app) as client:
        for path in ("/model-card", "/model-card.xml"):
            answer = client.get(path)
            assert answer.status_code == 503 and answer.headers["retry-after"] == "5"
            assert answer.json() == {"detail": "no model is loaded yet"}
