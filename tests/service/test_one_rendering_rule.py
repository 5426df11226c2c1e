"""One rendering rule at every door (docs/configuration.md, `MEDTPE_CODES_DIR`): the artefact's
code descriptions first, then the site's table for the codes the artefact does not describe. One
patient through `/predict` (MEDS events and a Bundle), a CDS hook, `medtpe predict --meds` and
`--fhir`, with a site table that describes codes the artefact does not and redescribes one it
does, gets one prompt (the engine ids each instant engine got); `codes_replace` is the explicit
full replacement, named in `/readyz` and the job's summary. Asked several tasks at every door
(`/predict`'s `tasks`, a CDS service given several by `MEDTPE_CDS_SERVICE_TASKS`, the batch job's
further tasks), the patient gets one prompt per task, the record rendered once for all of them:
the tasks' ids agree up to the end of the record, the same shared part at every door."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from medtpe.batch.fhir_job import FhirInput, run_fhir
from medtpe.batch.job import Job, run_local
from medtpe.core.cds.services import get_service
from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
from medtpe.core.meds import MedsDataset
from medtpe.core.meds.readers import read_code_descriptions, write_code_descriptions
from medtpe.core.tasks import Task, get_task
from medtpe.core.tokenizer.artefact_manifest import ArtefactBundle
from medtpe.inference.model import load_model
from medtpe.inference.sampling import Sampling
from medtpe.service.settings import ServiceSettings
from tests.batch.test_fhir_job import RecordingEngine, patient_id, records
from tests.support.bulk_server import resources_by_type, write_export
from tests.support.cds_support import hook_request, prefetch_of
from tests.support.ehr import Ehr
from tests.support.mimic_fhir_fixture import FIXTURE
from tests.support.service_support import (
    SERVICE_API_KEY,
    instant_client,
    instant_settings,
    own_ledger_environment,
)

ICU = get_service("medtpe-icu-mortality-patient-view")
TASK = get_task("icu_mortality")
SEVERAL = get_service("medtpe-icu-mortality-encounter-start")
"""The CDS service configured with `TASKS` (`ICU` keeps its own task)."""
TASKS = (TASK, get_task("readmission_30d"), get_task("pancreatic_cancer_1y"))
BASE = "http://testserver"
AUTH = {"Authorization": f"Bearer {SERVICE_API_KEY}"}

own_ledger = pytest.fixture(scope="module", autouse=True)(own_ledger_environment)
"""The module's batch runs record to a ledger of their own, signed with the test key."""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, service_files: tuple[Path, Path]) -> Path:
    """The fixture dataset with a codes table of the site's own: every code of its first
    subject the artefact does not describe, and one the artefact describes, otherwise."""
    root = tmp_path_factory.mktemp("site") / "meds"
    shutil.copytree(FIXTURE, root)
    artefact = ArtefactBundle.from_pretrained(service_files[0]).descriptions
    dataset = MedsDataset.load(root)
    codes = set(dataset.events(dataset.subject_ids[0]).codes)
    undescribed = sorted(codes - set(artefact))
    described = sorted(codes & set(artefact))
    assert undescribed and described
    table = {code: f"site's own {code.lower()}" for code in undescribed}
    table[described[0]] = "the site's other words"
    write_code_descriptions(root, read_code_descriptions(root) | table)
    return root


@pytest.fixture(scope="module")
def settings(service_files: tuple[Path, Path], ehr: Ehr, site: Path) -> ServiceSettings:
    return instant_settings(
        service_files,
        codes_dir=site,
        max_request_bytes=32 * 1024 * 1024,
        cds_service_tasks={SEVERAL.id: [task.name for task in TASKS]},
        **ehr.service_settings(BASE),
    )


@pytest.fixture(scope="module")
def client(settings: ServiceSettings) -> Iterator[TestClient]:
    with instant_client(settings) as client:
        yield client


def meds_events(dataset: MedsDataset, subject: int) -> list[dict[str, Any]]:
    events = dataset.events(subject)
    return [
        {
            "subject_id": subject,
            "time": None if str(t) == "NaT" else str(t.astype("datetime64[us]")),
            "code": code,
            "numeric_value": None if value != value else float(value),
            "text_value": text,
        }
        for t, code, value, text in zip(
            events.times, events.codes, events.numeric_values, events.text_values, strict=True
        )
    ]


def job(meds_dir: Path, tasks: tuple[Task, ...] = (TASK,)) -> Job:
    """`tasks` asked about every subject of `meds_dir` at its last event, one record in the
    engine at a time (the engine's prompts in record order, each record's in task order)."""
    return Job(
        meds_dir=meds_dir,
        task=tasks[0],
        more_tasks=tasks[1:],
        times=(None,),
        sampling=Sampling(max_new_tokens=8),
        concurrency=1,
    )


def first_patient(site: Path) -> tuple[MedsDataset, int, dict[str, Any]]:
    """The site dataset, its first subject and that subject's record as a FHIR Bundle."""
    dataset = MedsDataset.load(site)
    subject = dataset.subject_ids[0]
    return dataset, subject, fhir_bundle_from_meds(dataset.events(subject))


def test_one_patient_gets_one_prompt_through_every_door(
    client: TestClient, settings: ServiceSettings, ehr: Ehr, site: Path, tmp_path: Path
) -> None:
    dataset, subject, bundle = first_patient(site)
    app_engine = client.app.state.service.engine
    prompts = {}

    by_events = client.post(
        "/predict", json={"task": TASK.name, "events": meds_events(dataset, subject)}, headers=AUTH
    )
    assert by_events.status_code == 200, by_events.text
    prompts["/predict events"] = app_engine.prompts[-1]
    by_bundle = client.post("/predict", json={"task": TASK.name, "bundle": bundle}, headers=AUTH)
    assert by_bundle.status_code == 200, by_bundle.text
    prompts["/predict Bundle"] = app_engine.prompts[-1]
    patient = patient_id(bundle)
    url = f"/cds-services/{ICU.id}"
    body = hook_request(ICU, patient, prefetch=prefetch_of(ICU, bundle, patient))
    hooked = client.post(url, json=body, headers=ehr.authorization(BASE + url))
    assert hooked.status_code == 200, hooked.text
    prompts["hook"] = app_engine.prompts[-1]

    config = replace(settings.model(), codes_dir=site)  # as `medtpe predict --meds site` sets it
    RecordingEngine.made.clear()
    run_local(config, job(site), tmp_path / "meds-out", engine_factory=RecordingEngine)
    rows = records(tmp_path / "meds-out")
    (engine,) = RecordingEngine.made
    by_subject = dict(zip([r["subject_id"] for r in rows], engine.prompts, strict=True))
    prompts["--meds"] = by_subject[subject]

    export = write_export(resources_by_type([bundle]), tmp_path / "export")
    RecordingEngine.made.clear()
    summary = run_fhir(
        config,
        job(tmp_path),
        FhirInput((export,)),
        tmp_path / "fhir-out",
        engine_factory=RecordingEngine,
    )
    (engine,) = RecordingEngine.made
    prompts["--fhir"] = engine.prompts[0]

    assert len({tuple(ids) for ids in prompts.values()}) == 1, {
        door: len(ids) for door, ids in prompts.items()
    }
    assert summary["this_run"]["descriptions"] == "supplemented"
    ready = client.get("/readyz", headers=AUTH).json()
    assert ready["rendering"]["descriptions"] == "supplemented"

    base = client.app.state.service.model.predictor.tokenizer.base
    text = base.decode(prompts["--meds"])
    assert "site's own" in text  # the site's table describes what the artefact does not
    assert "the site's other words" not in text  # never in place of the artefact's


def leading_agreement(prompts: list[list[int]]) -> int:
    """How many leading ids all of `prompts` share."""
    return next(
        (i for i, ids in enumerate(zip(*prompts, strict=False)) if len(set(ids)) > 1),
        min(map(len, prompts)),
    )


def test_several_tasks_get_one_prompt_each_through_every_door(
    client: TestClient, settings: ServiceSettings, ehr: Ehr, site: Path, tmp_path: Path
) -> None:
    dataset, subject, bundle = first_patient(site)
    names = [task.name for task in TASKS]
    app_engine = client.app.state.service.engine
    prompts: dict[str, list[list[int]]] = {}
    stated: dict[str, int] = {}  # /predict's shared tokens, in the engine's (MedTPE) ids
    predictor = client.app.state.service.model.predictor
    assert predictor.mode == "medtpe"

    def asked(door: str, url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        before = len(app_engine.prompts)
        answer = client.post(url, json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        prompts[door] = app_engine.prompts[before:]  # each task's, in the order asked
        assert len(prompts[door]) == len(TASKS), door
        return answer.json()

    for door, record in (
        ("/predict events", {"events": meds_events(dataset, subject)}),
        ("/predict Bundle", {"bundle": bundle}),
    ):
        answer = asked(door, "/predict", {"tasks": names, **record}, AUTH)
        assert [result["task"] for result in answer["results"]] == names
        stated[door] = answer["shared_tokens"]["medtpe"]
    patient = patient_id(bundle)
    url = f"/cds-services/{SEVERAL.id}"
    body = hook_request(SEVERAL, patient, prefetch=prefetch_of(SEVERAL, bundle, patient))
    cards = asked("hook", url, body, ehr.authorization(BASE + url))["cards"]
    assert [card["summary"].partition(": ")[0] for card in cards] == [t.title for t in TASKS]

    config = replace(settings.model(), codes_dir=site)  # as `medtpe predict --meds site` sets it
    RecordingEngine.made.clear()
    run_local(config, job(site, TASKS), tmp_path / "meds-out", engine_factory=RecordingEngine)
    subjects = [row["subject_id"] for row in records(tmp_path / "meds-out" / TASK.name)]
    (engine,) = RecordingEngine.made
    n = len(TASKS)
    per_record = [engine.prompts[i : i + n] for i in range(0, len(engine.prompts), n)]
    prompts["--meds"] = dict(zip(subjects, per_record, strict=True))[subject]

    export = write_export(resources_by_type([bundle]), tmp_path / "export")
    RecordingEngine.made.clear()
    run_fhir(
        config,
        job(tmp_path, TASKS),
        FhirInput((export,)),
        tmp_path / "fhir-out",
        engine_factory=RecordingEngine,
    )
    (engine,) = RecordingEngine.made
    prompts["--fhir"] = engine.prompts

    for i, task in enumerate(TASKS):  # each task one prompt, whatever the door
        by_door = {door: ids[i] for door, ids in prompts.items()}
        assert len({tuple(ids) for ids in by_door.values()}) == 1, (
            task.name,
            {door: len(ids) for door, ids in by_door.items()},
        )
    # the record rendered once for all the tasks: their ids agree up to its end at every door
    record = predictor.prepare_all(TASKS, dataset.events(subject), None)[0].prompt
    shared = record.shared_medtpe_ids(predictor.tokenizer)  # the head and the record
    assert predictor.tokenizer.decode(shared).endswith(record.record_text)
    assert stated == {door: len(shared) for door in stated}
    agreement = {door: leading_agreement(ids) for door, ids in prompts.items()}
    assert len(set(agreement.values())) == 1, agreement
    for door, ids in prompts.items():
        assert all(one[: len(shared)] == shared for one in ids), door
        assert agreement[door] < min(map(len, ids)), door  # the tasks' own texts differ


def test_a_full_replacement_is_explicit_and_named(settings: ServiceSettings, site: Path) -> None:
    model = load_model(replace(settings.model(), codes_replace=True))
    assert model.rendering.descriptions == "override"
    assert model.predictor.descriptions == read_code_descriptions(site)
    with pytest.raises(ValueError, match="codes_dir"):
        load_model(replace(settings.model(), codes_dir=None, codes_replace=True))
