"""The service renders a record as its artefact's build did: the default artefact ships the code
descriptions its text was rendered with (`metadata/codes.parquet`, recorded with the renderer's
version in its manifest), a service with no settings loads them, and one given another table
(`MEDTPE_CODES_DIR`) says so at start, in its log and in `/readyz`."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from medtpe.core.meds.readers import MedsDataset, read_code_descriptions, read_labels
from medtpe.core.paths import default_artefact_dir, default_model_dir
from medtpe.core.prompt import ChatTemplate, build_prompt
from medtpe.core.prompt.render import RENDER_VERSION
from medtpe.core.tokenizer import BaseTokenizer
from medtpe.core.tokenizer.artefact_manifest import descriptions_digest
from medtpe.inference.model import load_model
from medtpe.service.settings import ServiceSettings
from tests.support.mimic_fhir_fixture import FIXTURE
from tests.support.paths import ROOT
from tests.support.render_pins import SHARED_MEDS
from tests.support.service_support import instant_client, own_ledger_settings

HELD_OUT = 10012853
"""A subject of the MIMIC-IV demo held out of the default artefact's build (its split in
`build_report.json`), one of the stays of the committed MIMIC-IV fixture (ODbL 1.0, attribution
in tests/fixtures/fhir/README.md)."""
TASK = "icu_mortality"


def default_settings(service_files: tuple[Path, Path], **overrides: Any) -> ServiceSettings:
    """The service's defaults, but for the test model files' paths and a ledger of the test's own
    (the default one is the checkout's `.cache/ledger.sqlite3`)."""
    artefact, export = service_files
    return ServiceSettings(
        artefact_dir=artefact, export_dir=export, **own_ledger_settings(), **overrides
    )


@pytest.fixture(scope="module")
def default_api(service_files: tuple[Path, Path]) -> Iterator[TestClient]:
    """The app in-process, on an engine that answers at once, with the default settings."""
    assert service_files[0] == default_artefact_dir()  # the default artefact is committed
    with instant_client(default_settings(service_files)) as client:
        yield client


def held_out_point() -> datetime:
    """The held-out stay's ICU-mortality prediction time."""
    (point,) = [p for p in read_labels(FIXTURE / "labels") if p.subject_id == HELD_OUT]
    return point.prediction_time


def request_events(meds_dir: Path, subject_id: int) -> list[dict[str, Any]]:
    """The subject's rows of the MEDS dataset's data files as a client sends them (JSON)."""
    table = pq.read_table(meds_dir / "data")
    rows = table.filter(pc.equal(table["subject_id"], subject_id)).to_pylist()
    for row in rows:
        row["time"] = None if row["time"] is None else row["time"].isoformat()
    return rows


def test_the_held_out_record_is_served_as_the_build_rendered_it(
    default_api: TestClient,
) -> None:
    report = json.loads((default_artefact_dir() / "build_report.json").read_text())
    assert HELD_OUT in report["held_out_subjects"]
    when = held_out_point()
    body = {"task": TASK, "events": request_events(FIXTURE, HELD_OUT)}
    served = default_api.post("/tokenize", json=body | {"prediction_time": when.isoformat()})
    assert served.status_code == 200, served.text

    # the build's rendering: `build_prompt` with the MEDS directory's own descriptions
    dataset = MedsDataset.load(FIXTURE)
    base = BaseTokenizer.load(default_model_dir())
    expected = build_prompt(
        TASK,
        dataset.events(HELD_OUT),
        when,
        base,
        ChatTemplate.from_model_dir(default_model_dir()),
        ServiceSettings.model_fields["max_input_tokens"].default,
        dataset.descriptions,
    )
    ids = served.json()["original"]["ids"]
    assert base.decode(ids).encode() == expected.text.encode()
    assert ids == expected.head_ids + expected.record_ids + expected.tail_ids
    assert "\nHeart Rate: " in expected.text and "Lab 220045" not in expected.text

    rendering = default_api.get("/readyz").json()["rendering"]
    assert rendering["descriptions"] == "artefact" and rendering["matches_artefact"] is True
    assert rendering["render_version"] == RENDER_VERSION and rendering["differences"] == []
    manifest = json.loads((default_artefact_dir() / "manifest.json").read_text())
    assert rendering["digest"] == manifest["rendering"]["descriptions_sha256"]


def test_other_descriptions_are_reported_at_start(
    service_files: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """`MEDTPE_CODES_DIR` naming another table (the fixture's: the codes of three stays) only
    describes codes the artefact does not (here none: the rendering is the artefact's); with
    `MEDTPE_CODES_REPLACE` it is used instead, with a warning in the log and
    `matches_artefact: false` (`/readyz`'s `rendering`)."""
    supplement = load_model(default_settings(service_files, codes_dir=FIXTURE).model()).rendering
    assert supplement.descriptions == "artefact" and supplement.matches_artefact is True
    settings = default_settings(service_files, codes_dir=FIXTURE, codes_replace=True)
    with caplog.at_level(logging.WARNING, logger="medtpe.inference.model"):
        rendering = load_model(settings.model()).rendering
    fixture_table = read_code_descriptions(FIXTURE)
    assert rendering.descriptions == "override" and rendering.matches_artefact is False
    assert rendering.digest == descriptions_digest(fixture_table)
    assert rendering.n_descriptions == len(fixture_table)
    (difference,) = rendering.differences
    assert f"code descriptions {len(fixture_table):,} codes" in difference
    warned = [r.getMessage() for r in caplog.records if r.name == "medtpe.inference.model"]
    assert len(warned) == 1 and f"codes_dir {FIXTURE}" in warned[0] and difference in warned[0]


@pytest.mark.skipif(
    not SHARED_MEDS.is_dir(), reason=f"the default artefact's build data is not here: {SHARED_MEDS}"
)
def test_the_artefact_ships_its_build_datasets_descriptions() -> None:
    manifest = json.loads((default_artefact_dir() / "manifest.json").read_text())
    built = manifest["rendering"]
    assert built["descriptions_sha256"] == descriptions_digest(read_code_descriptions(SHARED_MEDS))


README = ROOT / "README.md"
EXAMPLE = ROOT / "docs" / "examples" / "icu-stay-request.json"


def key_paths(value: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every path of object keys in a JSON value (lists: their first item's)."""
    if isinstance(value, dict):
        return set().union(*({(*prefix, k)} | key_paths(v, (*prefix, k)) for k, v in value.items()))
    if isinstance(value, list) and value:
        return key_paths(value[0], prefix)
    return set()


def test_the_readme_s_first_request_answers_as_the_readme_shows(default_api: TestClient) -> None:
    """The README's first request (a held-out MIMIC-IV ICU stay shipped as a file) through the
    service with no settings: every field the README's response shows is in the answer, and the
    compression it exists for is visible (at least 30 % fewer prompt tokens)."""
    json_type = {"content-type": "application/json"}
    answer = default_api.post("/predict", content=EXAMPLE.read_bytes(), headers=json_type)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["tokens"]["compression_rate"] >= 0.30
    assert body["events"]["kept"] < body["events"]["total"] == 1432
    shown = README.read_text().split("```json\n", 1)[1].split("```", 1)[0]
    assert key_paths(json.loads(shown)) <= key_paths(body)
