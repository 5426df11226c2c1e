"""The night job (`medtpe predict --fhir-server` / `--fhir`) against a hostile Bulk Data server and
a hostile export: a manifest naming files outside the export folder, unknown types or foreign
origins is refused naming its field, with nothing written and no success reported; a link planted
in the export folder is not followed; any `Retry-After` waits within the caps; and no line or
patient of an export stops the job: each bad one is an issue with its file and line, every other
patient is scored (a property over arbitrary bytes and JSON shapes, on the instant engine)."""

from __future__ import annotations

import gzip
import hashlib
import json
import string
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medtpe.batch import ndjson_lines
from medtpe.batch.bulk_client import (
    DEFAULT_TYPES,
    STATE_FILE,
    ExportRequest,
    ManifestError,
    check_manifest,
    export_from_server,
)
from medtpe.batch.fhir_export import (
    ISSUES_FILE,
    MANIFEST,
    export_files,
    partition_export,
    subject_of,
)
from medtpe.batch.fhir_http import FhirServerError, HttpSettings, retry_after_s
from medtpe.batch.fhir_job import FhirInput, run_fhir
from medtpe.batch.fhir_resource_types import R4_RESOURCE_TYPES
from medtpe.batch.smart_backend import ClientKey, public_jwks
from medtpe.cli.predict_commands import fhir_source, parse_partition
from medtpe.core.fhir import load_site_mapping
from medtpe.core.fhir.mapping import READ_TYPES
from medtpe.evaluation.runner import Sampling
from medtpe.inference.engines.instant import InstantEngine
from medtpe.service.settings import ServiceSettings
from tests.batch.test_fhir_job import job
from tests.support.bulk_server import (
    BULK_CLIENT,
    BulkServer,
    es384_key,
    fast_export,
    heart_rate,
    server_access,
    serving_bulk_data,
)
from tests.support.properties import examples
from tests.support.service_support import instant_settings, own_ledger_environment

FAST = fast_export(retries=1)
MAPPING = load_site_mapping()
SUBJECT_SYSTEM = "http://mimic.mit.edu/fhir/mimic/identifier/patient"
NIGHT_SAMPLING = Sampling(max_new_tokens=4)
VALID = ("valid-0", "valid-1", "valid-2")
"""The export's well-formed patients (no hostile line names them)."""

own_ledger = pytest.fixture(scope="module", autouse=True)(own_ledger_environment)
"""The module's batch runs record to a ledger of their own, signed with the test key."""


# --- the Bulk Data client against a hostile server ------------------------------------------


@pytest.fixture(scope="module")
def key() -> ClientKey:
    return es384_key()


@pytest.fixture(scope="module")
def serving(key: ClientKey) -> Iterator[BulkServer]:
    resources = {"Patient": [{"resourceType": "Patient", "id": "p0"}]}
    with serving_bulk_data(
        BulkServer(resources, clients={BULK_CLIENT: public_jwks(key)})
    ) as served:
        yield served


@pytest.fixture
def server(serving: BulkServer) -> BulkServer:
    """The module's server (one start, one stop), its request log emptied for the test."""
    serving.requests.clear()
    return serving


def _set(field: str, value: Any, key: str = "output") -> Callable[[dict[str, Any]], None]:
    def edit(manifest: dict[str, Any]) -> None:
        if key == "error":
            manifest["error"] = [{"type": "OperationOutcome", "url": manifest["output"][0]["url"]}]
        manifest[key][0][field] = value

    return edit


HOSTILE_MANIFESTS = {
    "absolute type": (_set("type", "/tmp/medtpe-escape"), "output[0].type"),
    "parent type": (_set("type", "../../escape"), "output[0].type"),
    "type with a separator": (_set("type", "Patient/../../x"), "output[0].type"),
    "unknown type": (_set("type", "Patients"), "output[0].type"),
    "type no string": (_set("type", ["Patient"]), "output[0].type"),
    "error file's type": (_set("type", "../x", key="error"), "error[0].type"),
    "file url": (_set("url", "file:///etc/passwd"), "output[0].url"),
    "plain http elsewhere": (_set("url", "http://files.example/p.ndjson"), "output[0].url"),
    "token to another origin": (_set("url", "https://files.example/p.ndjson"), "output[0].url"),
    "negative count": (_set("count", -1), "output[0].count"),
    "requiresAccessToken no boolean": (
        lambda m: m.update(requiresAccessToken="no"),
        "requiresAccessToken",
    ),
}


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("case", sorted(HOSTILE_MANIFESTS))
def test_a_hostile_manifest_is_refused_naming_its_field(
    server: BulkServer, key: ClientKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    edit, field = HOSTILE_MANIFESTS[case]
    honest = server.manifest

    def hostile(export_id: str, export: Any) -> dict[str, Any]:
        document = honest(export_id, export)
        edit(document)
        return document

    monkeypatch.setattr(server, "manifest", hostile)  # the honest one again after the test
    (tmp_path / "keys").mkdir()
    access = server_access(server, BULK_CLIENT, key, tmp_path / "keys")
    export = tmp_path / "out" / "export"
    with pytest.raises(
        ManifestError, match=f"manifest.*{field.replace('[', '.').replace(']', '.')}"
    ):
        export_from_server(access, ExportRequest(), export, FAST, progress=False)
    # no success: no manifest of a complete export, no file asked for, nothing but the state
    assert not (export / MANIFEST).exists()
    assert not [r for r in server.requests if "/files/" in r["path"]]
    state = f"out/export/{STATE_FILE}"
    assert files_under(tmp_path) == ["keys", f"keys/{key.kid}.pem", "out", "out/export", state]
    # the command reports the refusal, not an export
    options = {
        "fhir_dirs": (),
        "fhir_server": server.base,
        "export_level": "patient",
        "group_id": None,
        "export_types": (),
        "since": None,
        "client_id": BULK_CLIENT,
        "client_key": access.key_path,
        "client_kid": key.kid,
        "scope": "system/*.rs",
        "fhir_mapping": None,
        "bucket_mib": 64,
    }
    with pytest.raises(click.ClickException, match="refused"):
        fhir_source(options, tmp_path / "out")


def test_a_link_planted_in_the_export_folder_is_not_followed(
    server: BulkServer, key: ClientKey, tmp_path: Path
) -> None:
    (tmp_path / "keys").mkdir()
    access = server_access(server, BULK_CLIENT, key, tmp_path / "keys")
    outside = tmp_path / "outside.txt"
    outside.write_text("kept")
    for planted in ("Patient.000.ndjson.part", "Patient.000.ndjson"):
        export = tmp_path / planted
        export.mkdir()
        (export / planted).symlink_to(outside)
        with pytest.raises(FhirServerError, match="is not a file of"):
            export_from_server(access, ExportRequest(), export, FAST, progress=False)
        assert outside.read_text() == "kept" and not (export / MANIFEST).exists()


def test_the_default_export_types_are_fhir_r4_types() -> None:
    assert set(DEFAULT_TYPES) <= R4_RESOURCE_TYPES and len(R4_RESOURCE_TYPES) == 146


def manifest_entries() -> st.SearchStrategy[dict[str, Any]]:
    text = st.text(max_size=30) | st.sampled_from(sorted(R4_RESOURCE_TYPES))
    value = st.none() | st.booleans() | st.integers() | text | st.lists(text, max_size=2)
    return st.dictionaries(st.sampled_from(["type", "url", "count", "extension"]), value)


@settings(max_examples=examples(300), deadline=None)
@given(
    outputs=st.lists(manifest_entries(), max_size=4),
    errors=st.lists(manifest_entries(), max_size=2) | st.none() | st.text(max_size=5),
    requires=st.sampled_from([True, False, None, "yes"]),
)
def test_any_manifest_is_refused_or_names_only_files_of_the_export(
    outputs: list[dict[str, Any]], errors: Any, requires: Any
) -> None:
    base = "https://ehr.example/fhir/"
    manifest = {"output": outputs, "error": errors, "requiresAccessToken": requires}
    try:
        check_manifest(manifest, base)
    except ManifestError as exc:
        assert "manifest" in str(exc) and "refused" in str(exc)
        return
    for entry in [*outputs, *(errors or [])]:
        assert entry.get("type", "OperationOutcome") in R4_RESOURCE_TYPES
        assert set(entry.get("type", "")) <= set(string.ascii_letters)


@settings(max_examples=examples(300), deadline=None)
@given(
    value=st.text(st.characters(max_codepoint=255, exclude_characters="\r\n\0"), max_size=80)
    | st.sampled_from(["²", "٣", "9" * 5000, " 7 ", "Wed, 21 Oct 2015 07:28:00 GMT", "+5", "-3"])
)
def test_any_retry_after_waits_within_the_caps(value: str) -> None:
    http = HttpSettings(default_wait_s=2.0, max_wait_s=30.0)
    headers = httpx.Headers([(b"Retry-After", value.encode())])  # as a server's UTF-8 bytes
    wait = retry_after_s(headers, http)
    assert 0.0 <= wait <= 30.0
    stripped = value.strip()
    if stripped.isascii() and stripped.isdigit() and len(stripped) <= 9:
        assert wait == min(int(stripped), 30)
    elif not stripped.isascii() or stripped in ("+5", "-3") or len(stripped) > 64:
        assert wait == 2.0


@pytest.mark.parametrize("value", ["²/3", "0/³", "1/" + "9" * 5000, "-1/2", "2/2"])
def test_the_partition_option_takes_ascii_digits_only(value: str) -> None:
    with pytest.raises(click.BadParameter, match="I/N"):
        parse_partition(value)


# --- the night job against a hostile export ---------------------------------------------------


@pytest.fixture(scope="module")
def service(service_files: tuple[Path, Path]) -> ServiceSettings:
    return instant_settings(service_files)


def resource_lines(patient: str) -> dict[str, list[bytes]]:
    """A well-formed patient: the Patient and a heart rate, as export lines by type."""
    observation = heart_rate(f"{patient}-hr", patient, 80)
    birth = {"resourceType": "Patient", "id": patient, "birthDate": "2100-01-01"}
    return {
        "Patient": [json.dumps(birth).encode()],
        "Observation": [json.dumps(observation).encode()],
    }


def scored(out: Path) -> dict[int, str | None]:
    """Each record's error (None: scored) by subject id."""
    tables = [pq.read_table(p) for p in sorted(out.rglob("*.records.pq"))]
    rows = pa.concat_tables(tables).to_pylist() if tables else []
    return {r["subject_id"]: r["error"] for r in rows}


def valid_subjects() -> dict[str, int]:
    return {patient: subject_of(patient, None, MAPPING) for patient in VALID}


def snapshot(root: Path, skip: Path) -> dict[str, str]:
    """Every file under `root` but those under `skip`, by path: its content's digest."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file()
        else "dir"
        for p in sorted(root.rglob("*"))
        if skip not in p.parents and p != skip
    }


DEEP = 200_000


def no_engine(config: Any) -> InstantEngine:
    raise RuntimeError("no engine tonight")


def test_no_line_or_patient_stops_the_night_job(
    service: ServiceSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ndjson_lines, "MAX_LINE_BYTES", 1024 * 1024)
    lines = {kind: [] for kind in ("Patient", "Observation", "MedicationRequest")}
    for patient in VALID:
        for kind, found in resource_lines(patient).items():
            lines[kind] += found
    valid_hr = json.loads(lines["Observation"][0])
    hostile = {
        # raw \r as JSON whitespace: valid JSON, read as valid-0's resource
        "cr": json.dumps({**valid_hr, "id": "cr"}).replace(", ", ",\r ").encode(),
        "escaped newline": json.dumps(
            {
                "resourceType": "MedicationRequest",
                "id": "mr",
                "subject": {"reference": "Patient/refs"},
                "medicationReference": {"reference": "Medication/m\n1\t2 \u0000"},
            }
        ).encode(),
        "lone surrogate": json.dumps(
            {"resourceType": "Observation", "subject": {"reference": "Patient/\ud800"}}
        ).encode(),
        "shared id with a newline": b'{"resourceType":"Medication","id":"m\\n1"}',
        "deep element": b'{"resourceType":"Observation","id":"deep","subject":{"reference":'
        b'"Patient/valid-2"},"x":' + b"[" * DEEP + b"]" * DEEP + b"}",
        "deep array": b"[" * DEEP,
        "not UTF-8": b'{"resourceType":"Observation","id":"\xff\xfe"}',
        "oversized": b'{"resourceType":"Observation","note":"' + b"x" * 1_100_000 + b'"}',
        "not JSON": b"\x00\x01{{",
        "escaped tab in the patient": b'{"resourceType":"Observation","subject":'
        b'{"reference":"Patient/a\\tb"}}',
        "superscript identifier": json.dumps(
            {
                "resourceType": "Patient",
                "id": "sup",
                "identifier": [{"system": SUBJECT_SYSTEM, "value": "²"}],
            }
        ).encode(),
        "5,000 digits": json.dumps(
            {
                "resourceType": "Patient",
                "id": "digits",
                "identifier": [{"system": SUBJECT_SYSTEM, "value": "9" * 5000}],
            }
        ).encode(),
    }
    export = tmp_path / "export"
    export.mkdir()
    for kind, found in lines.items():
        text = b"".join(line + b"\n" for line in found) + b"\n".join(hostile.values()) + b"\n"
        (export / f"{kind}.000.ndjson").write_bytes(text)
    (export / "Observation.001.ndjson.gz").write_bytes(
        gzip.compress(b"\n".join(lines["Observation"]))[:-12]
    )
    out = tmp_path / "out"
    before = snapshot(tmp_path, out)
    # a first run stopped after the grouping (its engine fails to start), then resumed
    with pytest.raises(RuntimeError, match="no engine tonight"):
        run_fhir(
            service.model(),
            job(tmp_path, sampling=NIGHT_SAMPLING),
            FhirInput((export,)),
            out,
            engine_factory=no_engine,
        )
    summary = run_fhir(
        service.model(),
        job(tmp_path, sampling=NIGHT_SAMPLING),
        FhirInput((export,)),
        out,
        engine_factory=InstantEngine.factory(),
    )
    assert summary["this_run"]["fhir_export"]["partition_reused"] is True
    errors = scored(out)
    for patient, subject in valid_subjects().items():
        assert errors[subject] is None, (patient, errors[subject])
    assert snapshot(tmp_path, out) == before  # nothing written outside --out

    issues = [json.loads(row) for row in (out / ISSUES_FILE).read_text().splitlines()]
    reasons = {(Path(i["file"]).name, i["line"], i["reason"].split(":")[0]) for i in issues}
    order = list(hostile)
    for kind in lines:
        name, n = f"{kind}.000.ndjson", len(lines[kind])
        for case, reason in (
            ("deep element", "unreadable"),
            ("deep array", "unreadable"),
            ("not UTF-8", "unreadable"),
            ("oversized", "unreadable"),
            ("not JSON", "unreadable"),
            ("lone surrogate", "unreadable"),
            ("escaped tab in the patient", "no patient"),
            ("shared id with a newline", "no id"),
        ):
            assert (name, n + order.index(case) + 1, reason) in reasons, (name, case)
    assert any(i["reason"].startswith("unreadable: the file breaks off") for i in issues)
    deep = [i for i in issues if "nested over" in i["reason"]]
    assert len(deep) == 2 * len(lines)
    # the \r resource is valid-0's; the escaped reference's resource is kept, not the reference
    partition = partition_export(
        export_files(export), tmp_path / "work", mapping=MAPPING, progress=False
    )
    grouped = {
        patient: resources
        for bucket in range(partition.n_buckets)
        for patient, resources in partition.patients_of(bucket)
    }
    ids = {p: [json.loads(t).get("id") for t in r.texts] for p, r in grouped.items()}
    assert ids["valid-0"].count("cr") == 1 and ids["refs"] == ["mr"]
    assert grouped["refs"].lines[0].refs == ()


JSON_SCALARS = st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=20)
JSON_SHAPES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
REFERENCE = st.fixed_dictionaries(
    {
        "reference": st.sampled_from(["Patient/", "Medication/", "Location/", ""]).flatmap(
            lambda prefix: st.text(max_size=12).map(lambda tail: prefix + tail)
        )
    }
)
RESOURCE_SHAPES = st.fixed_dictionaries(
    {"resourceType": st.sampled_from(sorted(READ_TYPES)) | st.text(max_size=10)},
    optional={
        "id": st.text(max_size=10) | JSON_SHAPES,
        "subject": REFERENCE | JSON_SHAPES,
        "patient": REFERENCE,
        "medicationReference": REFERENCE | JSON_SHAPES,
        "location": st.lists(st.fixed_dictionaries({"location": REFERENCE}), max_size=2),
        "identifier": st.lists(
            st.fixed_dictionaries(
                {"system": st.just(SUBJECT_SYSTEM), "value": st.text(max_size=8)}
            ),
            max_size=1,
        ),
        "extra": JSON_SHAPES,
    },
)
HOSTILE_LINES = (
    st.binary(max_size=120)
    | JSON_SHAPES.map(lambda v: json.dumps(v).encode())
    | RESOURCE_SHAPES.map(
        lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")
    )
    | st.integers(90, 3000).map(
        lambda depth: b'{"resourceType":"Observation","x":' + b"[" * depth + b"]" * depth + b"}"
    )
).filter(lambda line: b"valid" not in line)


INSERTED = st.lists(
    st.tuples(
        st.sampled_from(["Patient", "Observation", "Junk"]), st.integers(0, 6), HOSTILE_LINES
    ),
    max_size=12,
)
"""Hostile lines, each with the file and the position it is inserted at."""


def hostile_export(root: Path, inserted: list[tuple[str, int, bytes]], gzipped: bytes) -> Path:
    """An export of the valid patients with `inserted` lines among theirs, a junk file and a
    `.ndjson.gz` file of `gzipped` bytes."""
    export = root / "export"
    export.mkdir()
    files: dict[str, list[bytes]] = {"Patient": [], "Observation": [], "Junk": []}
    for patient in VALID:
        for kind, found in resource_lines(patient).items():
            files[kind] += found
    for kind, at, line in inserted:
        files[kind].insert(min(at, len(files[kind])), line)
    for kind, found in files.items():
        (export / f"{kind}.000.ndjson").write_bytes(b"".join(line + b"\n" for line in found))
    (export / "Junk.001.ndjson.gz").write_bytes(gzipped)
    return export


def check_issues(issues: Path, export: Path) -> None:
    for row in issues.read_text().splitlines():
        issue = json.loads(row)
        assert Path(issue["file"]).parent == export and issue["line"] >= 1


@settings(max_examples=examples(150), deadline=None)
@given(inserted=INSERTED, gzipped=st.binary(max_size=64))
def test_any_bytes_in_an_export_leave_each_valid_patient_exactly_their_resources(
    inserted: list[tuple[str, int, bytes]], gzipped: bytes
) -> None:
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        export = hostile_export(root, inserted, gzipped)
        before = snapshot(root, root / "work")
        partition = partition_export(
            export_files(export), root / "work", mapping=MAPPING, progress=False
        )
        grouped = {
            patient: resources.texts
            for bucket in range(partition.n_buckets)
            for patient, resources in partition.patients_of(bucket)
        }
        for patient in VALID:
            own = [lines[0] for lines in resource_lines(patient).values()]
            assert sorted(grouped[patient]) == sorted(own)
        assert snapshot(root, root / "work") == before
        check_issues(root / "work" / ISSUES_FILE, export)


@settings(
    max_examples=examples(6),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(inserted=INSERTED, gzipped=st.binary(max_size=64))
def test_any_bytes_in_an_export_leave_every_valid_patient_scored(
    service: ServiceSettings,
    tmp_path_factory: pytest.TempPathFactory,
    inserted: list[tuple[str, int, bytes]],
    gzipped: bytes,
) -> None:
    root = tmp_path_factory.mktemp("hostile")
    export = hostile_export(root, inserted, gzipped)
    out = root / "out"
    before = snapshot(root, out)
    run_fhir(
        service.model(),
        job(root, sampling=NIGHT_SAMPLING),
        FhirInput((export,)),
        out,
        engine_factory=InstantEngine.factory(),
    )
    errors = scored(out)
    for patient, subject in valid_subjects().items():
        assert subject in errors and errors[subject] is None, (patient, errors.get(subject))
    assert snapshot(root, out) == before
    check_issues(out / ISSUES_FILE, export)
