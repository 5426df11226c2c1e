"""`medtpe predict --fhir` (`medtpe.batch.fhir_job.run_fhir`) on an engine that answers at once: the
same record through every door (a patient's export gives the prompt `/predict` gives their Bundle
and a CDS hook their prefetch: the engine ids compared), the job's outputs and failures located in
the export, resumption, and an export that changed under `--out`."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from meds_evaluation.schema import PredictionSchema
from starlette.testclient import TestClient

from medtpe.batch.fhir_export import export_files, partition_export
from medtpe.batch.fhir_job import (
    NO_FHIR_EVENTS,
    NO_PATIENT,
    ExportChangedError,
    FhirInput,
    prepare_patient,
    run_fhir,
)
from medtpe.batch.job import Job
from medtpe.cli.predict_commands import predict
from medtpe.core.cds.services import get_service
from medtpe.core.fhir import load_site_mapping
from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
from medtpe.core.meds import MedsDataset, read_labels
from medtpe.core.tasks import get_task
from medtpe.inference.engines.instant import InstantEngine
from medtpe.inference.engines.protocol import EngineConfig
from medtpe.inference.model import load_model
from medtpe.inference.sampling import Sampling
from medtpe.service.settings import ServiceSettings
from tests.support.bulk_server import resources_by_type, write_export
from tests.support.cds_support import hook_request, prefetch_of
from tests.support.ehr import Ehr
from tests.support.mimic_fhir_fixture import FIXTURE
from tests.support.paths import SHARED
from tests.support.service_support import (
    SERVICE_API_KEY,
    instant_client,
    instant_settings,
    own_ledger_environment,
)

ICU = get_service("medtpe-icu-mortality-patient-view")
TASK = get_task("icu_mortality")
BODY_BYTES = 32 * 1024 * 1024
BASE = "http://testserver"
SHARED_MEDS = SHARED / "data" / "mimic-iv-demo-meds"
SHARED_STAYS = 2
"""Labelled stays of the shared demo checked (of distinct subjects, spread over the labels)."""
EVENTS_AFTER = 50
"""Events after a stay's prediction time in its export (the mapping leaves them out)."""

own_ledger = pytest.fixture(scope="module", autouse=True)(own_ledger_environment)
"""The module's batch runs record to a ledger of their own, signed with the test key."""


class RecordingEngine(InstantEngine):
    """An instant engine (its `prompts`: the job's records in order at concurrency 1), each one
    made kept in `made`."""

    made: ClassVar[list[RecordingEngine]] = []

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config.model_dir, config.max_model_len or 8192)
        RecordingEngine.made.append(self)


@pytest.fixture(scope="module")
def settings(service_files: tuple[Path, Path], ehr: Ehr) -> ServiceSettings:
    return instant_settings(
        service_files, max_request_bytes=BODY_BYTES, **ehr.service_settings(BASE)
    )


@pytest.fixture(scope="module")
def client(settings: ServiceSettings) -> Iterator[TestClient]:
    with instant_client(settings) as client:
        yield client


def stay_bundles() -> dict[int, dict[str, Any]]:
    """The fixture's subjects' whole records as Bundles (as an EHR holds them), by subject."""
    dataset = MedsDataset.load(FIXTURE)
    return {s: fhir_bundle_from_meds(dataset.events(s)) for s in dataset.subject_ids}


def patient_id(bundle: dict[str, Any]) -> str:
    return next(
        e["resource"]["id"] for e in bundle["entry"] if e["resource"]["resourceType"] == "Patient"
    )


def job(tmp_path: Path, **changes: Any) -> Job:
    values = {
        "meds_dir": tmp_path,
        "task": TASK,
        "times": (None,),
        "sampling": Sampling(max_new_tokens=8),
        "concurrency": 1,
    }
    return Job(**(values | changes))


def records(out: Path) -> list[dict[str, Any]]:
    tables = [pq.read_table(p) for p in sorted(out.rglob("*.records.pq"))]
    return sorted(pa.concat_tables(tables).to_pylist(), key=lambda r: r["record"])


def test_a_patient_gets_the_prompt_of_predict_and_of_the_hook(
    client: TestClient, settings: ServiceSettings, ehr: Ehr, tmp_path: Path
) -> None:
    bundles = stay_bundles()
    export = write_export(
        resources_by_type(bundles.values()),
        tmp_path / "export",
        files_per_type=2,
        gzipped=("Observation",),
    )
    RecordingEngine.made.clear()
    out = tmp_path / "out"
    summary = run_fhir(
        settings.model(), job(tmp_path), FhirInput((export,)), out, engine_factory=RecordingEngine
    )
    assert summary["records"] == len(bundles) and summary["failures"] == 0
    (engine,) = RecordingEngine.made
    from_export = {
        row["subject_id"]: prompt for row, prompt in zip(records(out), engine.prompts, strict=True)
    }
    assert sorted(from_export) == sorted(bundles)

    app_engine = client.app.state.service.engine
    for subject, bundle in bundles.items():
        answer = client.post(
            "/predict",
            json={"task": TASK.name, "bundle": bundle},
            headers={"Authorization": f"Bearer {SERVICE_API_KEY}"},
        )
        assert answer.status_code == 200, answer.text
        assert app_engine.prompts[-1] == from_export[subject], subject

        patient = patient_id(bundle)
        body = hook_request(ICU, patient, prefetch=prefetch_of(ICU, bundle, patient))
        url = f"/cds-services/{ICU.id}"
        called = client.post(url, json=body, headers=ehr.authorization(BASE + url))
        assert called.status_code == 200, called.text
        assert app_engine.prompts[-1] == from_export[subject], subject


def broken_patient() -> dict[str, Any]:
    """A patient whose Observation holds a value no prompt can render (`valueRange`)."""
    bundle = copy.deepcopy(stay_bundles()[MedsDataset.load(FIXTURE).subject_ids[0]])
    for entry in bundle["entry"]:
        resource = entry["resource"]
        resource["id"] = f"b-{resource['id']}"
        if resource["resourceType"] == "Patient":
            resource["identifier"][0]["value"] = "777"
        else:
            resource["subject"]["reference"] = "Patient/b-" + resource["subject"][
                "reference"
            ].removeprefix("Patient/")
    observation = next(
        e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] == "Observation"
    )
    observation.pop("valueQuantity", None)
    observation["valueRange"] = {"low": {"value": 1}, "high": {"value": 2}}
    return bundle


def test_outputs_failures_resumption_and_a_changed_export(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    bundles = list(stay_bundles().values())
    bundles.append(broken_patient())
    bundles.append(
        {
            "resourceType": "Bundle",
            "type": "collection",
            "entry": [{"resource": {"resourceType": "Patient", "id": "empty"}}],
        }
    )
    export = write_export(resources_by_type(bundles), tmp_path / "export", files_per_type=3)
    labels = tmp_path / "labels.parquet"
    points = read_labels(FIXTURE / "labels" / "icu_mortality.parquet")
    table = pa.table(
        {
            "subject_id": pa.array([p.subject_id for p in points] + [777, 999], pa.int64()),
            "prediction_time": pa.array(
                [p.prediction_time for p in points] + [points[0].prediction_time] * 2,
                pa.timestamp("us"),
            ),
            "boolean_value": pa.array([p.label for p in points] + [True, False]),
        }
    )
    pq.write_table(table, labels)
    out = tmp_path / "out"
    RecordingEngine.made.clear()
    the_job = job(tmp_path, labels=labels, times=())
    summary = run_fhir(
        settings.model(), the_job, FhirInput((export,)), out, engine_factory=RecordingEngine
    )

    rows = records(out)
    assert [r["subject_id"] for r in rows] == [p.subject_id for p in points] + [777, 999]
    by_subject = {r["subject_id"]: r for r in rows}
    broken = by_subject[777]["error"]
    assert broken.startswith("fhir: FhirInputError: ") and "Observation.00" in broken
    assert "valueRange" in broken  # file:line of the resource, then the mapping's message
    where = broken.removeprefix("fhir: FhirInputError: ").split(": ")[0]
    path, line = where.rsplit(":", 1)
    assert json.loads(Path(path).read_text().splitlines()[int(line) - 1])["valueRange"]
    assert by_subject[999]["error"] == NO_PATIENT
    for point in points:
        assert by_subject[point.subject_id]["error"] is None
    predictions = pa.concat_tables(pq.read_table(p) for p in sorted(out.rglob("*.parquet")))
    PredictionSchema.align(predictions)
    assert predictions.num_rows == len(rows)
    assert summary["failure_kinds"] == {"fhir: FhirInputError": 1, NO_PATIENT: 1}
    export_counts = summary["this_run"]["fhir_export"]
    assert export_counts["patients"] == len(bundles) and export_counts["files"] >= 7
    assert export_counts["partition_reused"] is False
    # the refused record listed with the file and line of the resource the mapping names
    issues = [json.loads(row) for row in (out / "fhir_issues.ndjson").read_text().splitlines()]
    (unmappable,) = [i for i in issues if i["reason"].startswith("unmappable:")]
    assert unmappable["reason"] == f"unmappable: {broken}"
    assert unmappable["patient"] == patient_id(bundles[-2])  # the broken patient
    assert f"{unmappable['file']}:{unmappable['line']}" == where
    assert not list((out / ".fhir-work").glob("bucket-*"))  # done: the buckets removed

    # a second run writes nothing, starts no engine
    again = run_fhir(
        settings.model(), the_job, FhirInput((export,)), out, engine_factory=RecordingEngine
    )
    assert len(RecordingEngine.made) == 1
    assert again["this_run"]["records"] == 0 and again["records"] == len(rows)
    assert again["this_run"]["fhir_export"]["partition_reused"] is True

    # the patient without events, asked for at their last event
    times_out = tmp_path / "times"
    run_fhir(
        settings.model(),
        job(tmp_path, limit=len(bundles)),
        FhirInput((export,)),
        times_out,
        engine_factory=RecordingEngine,
    )
    errors = {r["subject_id"]: r["error"] for r in records(times_out)}
    assert len(errors) == len(bundles) and list(errors.values()).count(NO_FHIR_EVENTS) == 1

    # the export changed: the same --out refuses it
    (export / "Patient.000.ndjson").write_text((export / "Patient.000.ndjson").read_text() + "\n")
    with pytest.raises(ExportChangedError):
        run_fhir(settings.model(), the_job, FhirInput((export,)), out)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--meds", "."], "either --meds DIR or --fhir"),
        ([], "either --meds DIR or --fhir"),
        (["--partition", "0/2"], "not with FHIR input"),
    ],
)
def test_the_command_takes_one_input(tmp_path: Path, arguments: list[str], message: str) -> None:
    export = write_export({"Patient": [{"resourceType": "Patient", "id": "p"}]}, tmp_path / "e")
    fhir = [] if arguments == [] else ["--fhir", str(export)]
    result = CliRunner().invoke(
        predict,
        [*fhir, *arguments, "--task", TASK.name, "--out", str(tmp_path / "o"), "--times", "last"],
    )
    assert result.exit_code == 2 and message in result.output


@pytest.mark.skipif(not SHARED_MEDS.is_dir(), reason="needs ../shared/data/mimic-iv-demo-meds")
def test_shared_demo_stays_from_the_export_get_the_prompt_of_their_meds_events(
    settings: ServiceSettings, tmp_path: Path
) -> None:
    """The MIMIC-IV demo's stays, their subjects' whole records converted to NDJSON, prepared
    from the export as `--fhir` prepares them: the engine ids of `--meds` on their events."""
    dataset = MedsDataset.load(SHARED_MEDS)
    points = read_labels(SHARED_MEDS / "labels" / "icu_mortality.parquet")
    points = points[:: len(points) // SHARED_STAYS][:SHARED_STAYS]
    bundles = []
    for point in points:  # the record up to the stay's prediction time, and some events after
        events = dataset.events(point.subject_id)
        shown = len(events.before(point.prediction_time))
        bundles.append(
            fhir_bundle_from_meds(events.take(np.arange(len(events)) < shown + EVENTS_AFTER))
        )
    export = write_export(resources_by_type(bundles), tmp_path / "export", gzipped=("Observation",))
    mapping = load_site_mapping()
    partition = partition_export(
        export_files(export), tmp_path / "work", mapping=mapping, progress=False
    )
    by_subject = {s: p for p, s in partition.subjects().items()}
    grouped = {
        patient: found
        for bucket in range(partition.n_buckets)
        for patient, found in partition.patients_of(bucket)
    }
    config = replace(settings.model(), codes_dir=SHARED_MEDS)
    predictor = load_model(config).predictor
    for point in points:
        patient = by_subject[point.subject_id]
        found, subject = prepare_patient(
            predictor, [TASK], mapping, patient, grouped[patient], point.prediction_time
        )
        by_meds = predictor.prepare(TASK, dataset.events(point.subject_id), point.prediction_time)
        assert found is not None and subject == point.subject_id
        (prepared,) = found
        assert prepared.prompt.text == by_meds.prompt.text, point
        assert prepared.segmentation == by_meds.segmentation, point
