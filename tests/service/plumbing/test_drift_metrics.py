"""The drift figures (`medtpe.inference.drift`) and their counters on /metrics: the service on the
instant engine answering records whose codes the artefact knows and records whose codes it never
saw, through `/predict`, `/predict/batch` and a CDS hook (its site label the service's id)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from medtpe.core.cds.services import get_service
from medtpe.core.meds import MedsEvent, SubjectEvents
from medtpe.core.tasks import get_task
from medtpe.inference.drift import build_compression_rate, drift_figures
from medtpe.inference.model import LoadedModel, load_model
from medtpe.inference.predictor import PreparedRecord
from medtpe.service.plumbing.metrics import API_SITE
from tests.support.cds_support import ICU_PATIENT, hook_request, load_bundle, prefetch_of
from tests.support.ehr import CLOSED_FHIR_SERVER, Ehr
from tests.support.service_support import (
    AUTH,
    instant_client,
    instant_settings,
    synthetic_events,
)
from tests.support.unseen_codes import drift_metrics, unseen_events

TASK = "icu_mortality"
ICU = get_service("medtpe-icu-mortality-patient-view")
BASE = "http://testserver"


@pytest.fixture(scope="module")
def model(service_files: tuple[Path, Path]) -> LoadedModel:
    """The model the instant service loads (its predictor's tokenizer and codes metadata)."""
    return load_model(instant_settings(service_files).model())


def prepared(model: LoadedModel, events: list[dict]) -> PreparedRecord:
    subject = SubjectEvents.from_events([MedsEvent.model_validate(e) for e in events])
    return model.predictor.prepare(get_task(TASK), subject, None)


def test_figures_count_what_the_prompt_shows(model: LoadedModel) -> None:
    """Every count against its own definition, on a record that overflows the budget."""
    predictor = model.predictor
    record = prepared(model, unseen_events(1, 400))
    figures = drift_figures(record, predictor.tokenizer, predictor.descriptions)
    prompt = record.prompt
    assert figures.events == prompt.n_events_total == 402
    assert 0 < figures.events_dropped == prompt.n_events_total - prompt.n_events_kept
    # shown: the static GENDER//F, then the newest unseen codes (the birth, oldest, is dropped)
    newest = prompt.n_events_kept - 1
    assert figures.events_undescribed == newest + ("GENDER//F" not in predictor.descriptions)
    merged = [i for i in record.segmentation.medtpe_ids if predictor.tokenizer.pair_of(i)]
    assert figures.merged_tokens == len(merged)
    assert figures.original_tokens == len(record.segmentation.original_ids)
    assert figures.medtpe_tokens == len(record.segmentation.medtpe_ids)
    known = drift_figures(prepared(model, synthetic_events(2, 40)), predictor.tokenizer, {})
    assert known.events == 43 and known.events_dropped <= 1  # the birth, years before
    birth_shown = known.events_dropped == 0
    # no metadata at all: every shown event but the birth (named `Birth`) is undescribed
    assert known.events_undescribed == 43 - known.events_dropped - birth_shown


def test_statics_cut_by_the_budget_are_counted_in_code_order(model: LoadedModel) -> None:
    """A budget too small for every static event keeps the first ones in code order and no
    timed event."""
    statics = [{"subject_id": 3, "time": None, "code": f"STATIC_{i:03d}//X"} for i in range(300)]
    descriptions = {"STATIC_000//X": "Described"}
    record = prepared(model, statics + synthetic_events(3, 10))
    kept = record.prompt.n_events_kept
    assert 0 < kept < 300
    figures = drift_figures(record, model.predictor.tokenizer, descriptions)
    assert figures.events_undescribed == kept - 1


def test_build_figure_is_the_build_reports() -> None:
    artefact = Path("artefacts/smollm2-135m-icu")
    report = json.loads((artefact / "build_report.json").read_text())
    expected = report["measure"]["compression"]["prompt_compression_rate"]
    assert build_compression_rate(artefact.resolve()) == expected
    assert build_compression_rate(Path("/nonexistent")) is None


@pytest.fixture(scope="module")
def client(service_files: tuple[Path, Path], ehr: Ehr) -> Iterator[TestClient]:
    hooks = ehr.service_settings(BASE, CLOSED_FHIR_SERVER)
    settings = instant_settings(service_files, **hooks, cds_allow_http_fhir=True)
    with instant_client(settings) as client:
        yield client


def scraped(client: TestClient, site: str) -> dict[str, float]:
    return drift_metrics(client.get("/metrics", headers=AUTH).text, TASK, site)


def increase(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in before}


def test_unseen_codes_lower_compression_and_raise_the_undescribed_share(
    client: TestClient, model: LoadedModel
) -> None:
    """Known codes, then unseen ones, through /predict: the counters move by the figures of
    each record (site `api`); the unseen records compress less, show undescribed codes and
    fewer merged ids."""
    shares = {}
    for kind, events in (
        ("known", synthetic_events(11, 60)),
        ("unseen", unseen_events(12, 60, seed=5)),
    ):
        before = scraped(client, API_SITE)
        response = client.post("/predict", json={"task": TASK, "events": events}, headers=AUTH)
        assert response.status_code == 200, response.text
        moved = increase(before, scraped(client, API_SITE))
        predictor = model.predictor
        figures = drift_figures(
            prepared(model, events), predictor.tokenizer, predictor.descriptions
        )
        assert (
            moved["medtpe_drift_events_total"]
            == figures.events
            == response.json()["events"]["total"]
        )
        assert moved["medtpe_drift_events_dropped_total"] == figures.events_dropped
        assert moved["medtpe_drift_events_undescribed_total"] == figures.events_undescribed
        assert moved["medtpe_drift_merged_tokens_total"] == figures.merged_tokens
        tokens = response.json()["tokens"]
        assert (moved["original"], moved["medtpe"]) == (tokens["original"], tokens["medtpe"])
        shown = figures.events - figures.events_dropped
        shares[kind] = (
            1 - moved["medtpe"] / moved["original"],
            moved["medtpe_drift_events_undescribed_total"] / shown,
            moved["medtpe_drift_merged_tokens_total"] / moved["medtpe"],
        )
    assert shares["unseen"][0] < shares["known"][0] - 0.05
    assert shares["unseen"][1] > shares["known"][1] + 0.5
    assert shares["unseen"][2] < shares["known"][2]
    build = build_compression_rate(model.bundle.path)
    assert scraped(client, API_SITE)["build"] == (build if build is not None else 0.0)


def test_batch_answers_count_each_record(client: TestClient) -> None:
    before = scraped(client, API_SITE)
    records = [{"task": TASK, "events": synthetic_events(20 + i, 20)} for i in range(3)]
    response = client.post("/predict/batch", json={"records": records}, headers=AUTH)
    assert response.status_code == 200, response.text
    moved = increase(before, scraped(client, API_SITE))
    assert moved["medtpe_drift_events_total"] == sum(
        r["events"]["total"] for r in response.json()["results"]
    )


def test_a_hook_answer_is_counted_under_its_service_id(client: TestClient, ehr: Ehr) -> None:
    before = scraped(client, ICU.id)
    url = f"/cds-services/{ICU.id}"
    body = hook_request(ICU, ICU_PATIENT, prefetch=prefetch_of(ICU, load_bundle(), ICU_PATIENT))
    response = client.post(url, json=body, headers=ehr.authorization(BASE + url))
    assert response.status_code == 200, response.text
    moved = increase(before, scraped(client, ICU.id))
    assert moved["medtpe_drift_events_total"] == 31  # the card says "31 of 31 events"
    assert moved["original"] > moved["medtpe"] > 0
