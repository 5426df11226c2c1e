"""An export directory grouped by patient on disk (`medtpe.batch.fhir_export`): each patient gets
exactly their resources (and the shared ones they reference), whatever the files' split, compression
and bucket count; bad lines are counted and located, never a crash."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from medtpe.batch.fhir_export import (
    ISSUES_FILE,
    MAX_GZIP_RATIO,
    ExportError,
    estimated_bytes,
    export_files,
    partition_export,
    patient_bundles,
)
from medtpe.core.fhir import load_site_mapping
from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
from medtpe.core.meds import MedsDataset
from tests.support.bulk_server import resources_by_type, write_export
from tests.support.mimic_fhir_fixture import FIXTURE
from tests.support.paths import FIXTURES

MAPPING = load_site_mapping()
READ = {"Patient", "Observation", "Condition", "Procedure", "Encounter"}
READ |= {"MedicationAdministration", "MedicationRequest", "Medication", "Location"}


def fixture_bundles() -> list[dict[str, Any]]:
    """The MIMIC-IV demo fixture's subjects as Bundles, and the clinosim patients'."""
    dataset = MedsDataset.load(FIXTURE)
    bundles = [fhir_bundle_from_meds(dataset.events(s)) for s in dataset.subject_ids]
    for path in sorted((FIXTURES / "fhir" / "clinosim").glob("*.json.gz")):
        bundles.append(json.loads(gzip.decompress(path.read_bytes())))
    return bundles


def patient_of(bundle: dict[str, Any]) -> str:
    return next(
        e["resource"]["id"] for e in bundle["entry"] if e["resource"]["resourceType"] == "Patient"
    )


def own_resources(bundle: dict[str, Any]) -> Counter[str]:
    """The patient's resources of the types the mapping reads, as JSON texts."""
    return Counter(
        json.dumps(e["resource"], sort_keys=True)
        for e in bundle["entry"]
        if e["resource"]["resourceType"] in READ
        and e["resource"]["resourceType"] not in {"Medication", "Location"}
    )


@pytest.mark.parametrize("bucket_kib", [64, 100_000])
def test_each_patient_gets_exactly_their_resources(tmp_path: Path, bucket_kib: int) -> None:
    bundles = fixture_bundles()
    export = write_export(
        resources_by_type(bundles),
        tmp_path / "export",
        files_per_type=2,
        gzipped=("Observation",),
        manifest=True,
    )
    files = export_files(export)
    assert any(f.path.name.endswith(".ndjson.gz") for f in files)
    partition = partition_export(
        files, tmp_path / "work", mapping=MAPPING, bucket_bytes=bucket_kib * 1024, progress=False
    )
    assert (partition.n_buckets > 1) == (bucket_kib == 64)
    grouped = {}
    for bucket in range(partition.n_buckets):
        for patient, resources in partition.patients_of(bucket):
            assert partition.bucket_of(patient) == bucket
            texts = [json.loads(t) for t in resources.texts]
            # the export's order: files (the manifest's), then lines
            places = [(line.file, line.line) for line in resources.lines]
            assert places == sorted(places)
            grouped[patient] = Counter(json.dumps(r, sort_keys=True) for r in texts)
    assert grouped == {patient_of(b): own_resources(b) for b in bundles}
    counts = partition.counts
    assert counts.patients == len(bundles) and counts.issues == {}
    assert counts.manifest_counts == {}
    assert sum(counts.grouped.values()) == sum(sum(own_resources(b).values()) for b in bundles)
    assert partition.subjects()[patient_of(bundles[0])] == MedsDataset.load(FIXTURE).subject_ids[0]


def test_bad_lines_are_counted_and_located_never_a_crash(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    patient = {"resourceType": "Patient", "id": "p1", "birthDate": "2100-01-01"}
    observation = {
        "resourceType": "Observation",
        "id": "o1",
        "status": "final",
        "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}]},
        "subject": {"reference": "https://ehr.example/fhir/Patient/p1/_history/3"},
        "effectiveDateTime": "2150-01-01T00:00:00Z",
    }
    lines = [
        json.dumps(patient),
        "{not json",
        "[1, 2]",
        json.dumps({"id": "x"}),
        "",
        json.dumps({**observation, "id": "o2", "subject": {"reference": "Group/g1"}}),
        json.dumps({**observation, "id": "o3", "subject": {"reference": "Patient/a b"}}),
        json.dumps({"resourceType": "Practitioner", "id": "dr"}),
        json.dumps(observation),
    ]
    (export / "mixed.ndjson").write_text("\n".join(lines) + "\n")
    partition = partition_export(
        export_files(export), tmp_path / "work", mapping=MAPPING, progress=False
    )
    ((name, resources),) = [
        grouped for b in range(partition.n_buckets) for grouped in partition.patients_of(b)
    ]
    assert name == "p1"
    assert [json.loads(t)["id"] for t in resources.texts] == ["p1", "o1"]
    counts = partition.counts
    assert counts.lines == len(lines) and counts.not_read == {"Practitioner": 1}
    assert counts.issues == {"unreadable": 3, "no patient": 2}
    issues = [json.loads(row) for row in (tmp_path / "work" / ISSUES_FILE).read_text().splitlines()]
    where = {(Path(i["file"]).name, i["line"]) for i in issues}
    assert where == {("mixed.ndjson", n) for n in (2, 3, 4, 6, 7)}


def test_referenced_medications_and_locations_join_the_patient(tmp_path: Path) -> None:
    patient = {"resourceType": "Patient", "id": "p1"}
    request = {
        "resourceType": "MedicationRequest",
        "id": "r1",
        "status": "active",
        "intent": "order",
        "subject": {"reference": "Patient/p1"},
        "medicationReference": {"reference": "Medication/m1"},
        "authoredOn": "2150-01-01T00:00:00Z",
    }
    encounter = {
        "resourceType": "Encounter",
        "id": "e1",
        "status": "finished",
        "class": {"code": "IMP"},
        "subject": {"reference": "Patient/p1"},
        "location": [{"location": {"reference": "Location/ward-1"}}],
    }
    medication = {"resourceType": "Medication", "id": "m1", "code": {"text": "heparin"}}
    unused = {"resourceType": "Medication", "id": "m2"}
    location = {"resourceType": "Location", "id": "ward-1", "name": "ICU"}
    by_type = {
        "MedicationRequest": [request],
        "Encounter": [encounter],
        "Patient": [patient],
        "Medication": [medication, unused],
        "Location": [location],
    }
    export = write_export(by_type, tmp_path / "export")
    (bundle,) = patient_bundles(export)
    ids = [e["fullUrl"] for e in bundle["entry"]]
    # the export's file order (name order without a manifest), then the shared resources in
    # the order they are first referenced
    assert ids == [
        "Encounter/e1",
        "MedicationRequest/r1",
        "Patient/p1",
        "Location/ward-1",
        "Medication/m1",
    ]


def test_a_later_export_replaces_a_resource_and_adds_new_ones(tmp_path: Path) -> None:
    patient = {"resourceType": "Patient", "id": "p1", "gender": "female"}
    base = write_export({"Patient": [patient]}, tmp_path / "base")
    changed = {**patient, "gender": "male"}
    other = {"resourceType": "Patient", "id": "p2"}
    increment = write_export({"Patient": [changed, other]}, tmp_path / "increment")
    files = export_files(base) + export_files(increment)
    partition = partition_export(files, tmp_path / "work", mapping=MAPPING, progress=False)
    grouped = {
        p: [json.loads(t) for t in r.texts]
        for b in range(partition.n_buckets)
        for p, r in partition.patients_of(b)
    }
    assert grouped == {"p1": [changed], "p2": [other]}


def test_a_manifest_naming_a_missing_file_is_an_unfinished_export(tmp_path: Path) -> None:
    export = write_export({"Patient": [{"resourceType": "Patient", "id": "p"}]}, tmp_path / "x")
    manifest = {"output": [{"type": "Patient", "url": "https://ehr/files/Patient.000.ndjson"}]}
    manifest["output"].append({"type": "Observation", "url": "Observation.000.ndjson"})
    (export / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match="lacks"):
        export_files(export)
    manifest["output"].pop()
    manifest["output"][0]["count"] = 2
    (export / "manifest.json").write_text(json.dumps(manifest))
    (file,) = export_files(export)
    partition = partition_export([file], tmp_path / "w", mapping=MAPPING, progress=False)
    assert partition.counts.manifest_counts == {str(file.path): [2, 1]}
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match=r"no \.ndjson"):
        export_files(tmp_path / "empty")


def test_a_gzip_trailer_claiming_more_than_deflate_can_hold_is_not_believed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "Observation.000.ndjson.gz"
    text = b'{"resourceType": "Patient", "id": "p"}\n' * 300
    whole = gzip.compress(text)
    path.write_bytes(whole[:-4] + (2**32 - 1).to_bytes(4, "little"))  # "4 GiB" in ~80 bytes
    assert estimated_bytes(path) == len(whole) * MAX_GZIP_RATIO
    path.write_bytes(whole)
    assert estimated_bytes(path) == len(text)
