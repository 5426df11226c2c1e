"""A FHIR Bulk Data export directory read one patient at a time, in memory bounded by the largest
patient rather than by the export.

An export directory holds NDJSON files (`*.ndjson`, `*.ndjson.gz`: one resource per line, one or
several files per resource type), and its `manifest.json` when the export wrote one: then the
files it lists, in its order (an `output` entry's `url` is a file name in the directory, or a URL
whose last path segment is one), else every NDJSON file in name order.

One pass over the lines (gzip read as a stream) writes each resource the mapping reads
(`medtpe.core.fhir.mapping.READ_TYPES`) into one of K bucket files, chosen by a hash of its
patient id: the Patient's own `id`, else its `subject` or `patient` reference (`Patient/<id>`,
also as an absolute URL or with `/_history/`). K is chosen from the export's size so that a bucket
holds about `bucket_bytes` of resources. The resources no patient owns that a patient's resources
reference (Medication, Location) go to an on-disk SQLite table, looked up per patient. Then a
bucket is indexed by patient in one read (where each patient's rows lie: `Bucket`) and each
patient's rows read when asked for, so memory holds the index (16 bytes a run of adjacent rows)
and one patient, not the bucket (patients in id order); a patient's resources keep
the export's order (files, then lines), the referenced Medication and Location resources after
them; a later line of the same resource (type and id) replaces an earlier one, so several exports
read in order (a base export, then `_since` increments) give each patient's current resources.
The pass records each Patient's MEDS subject id (`meds_from_fhir` of the Patient alone, as the
whole record gives it).

Never a crash on the data: a line that is no JSON object with a `resourceType` (not UTF-8, not
JSON, nested deeper than `MAX_JSON_DEPTH`, longer than `MAX_LINE_BYTES`), a mapped resource that
names no patient, a malformed patient reference, a Patient the mapping cannot read, or a file that
breaks off (a damaged gzip stream: its lines before the break are read) is counted and written to
an issues file with its file and line, and the pass goes on; resources of types the mapping does
not read are counted per type (types FHIR R4 does not name together, as `(other)`). The depth is
checked on the bytes before any JSON parser sees a line, so no parser's recursion is reached.
A bucket file is a sequence of length-prefixed records (`_RECORD`: the lengths and positions, then
the patient id, the resource key, the shared references and the line's bytes as they are), so no
byte of a resource can break it; the ids it holds are FHIR ids (`FHIR_ID`), checked.

    partition = partition_export(export_files(Path("export")), Path("work"), mapping=mapping)
    for patient, resources in partition.patients_of(0):
        record = meds_from_fhir(resources.texts, mapping=mapping, patient_id=patient)
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import re
import sqlite3
import struct
import tempfile
import time
import zlib
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple
from urllib.parse import urlparse

import msgspec
import numpy as np
from tqdm import tqdm

from medtpe.batch.defaults import DEFAULT_BUCKET_MIB
from medtpe.batch.fhir_resource_types import R4_RESOURCE_TYPES
from medtpe.core.fhir import SiteMapping, load_site_mapping, meds_from_fhir
from medtpe.core.fhir.mapping import READ_TYPES

MANIFEST = "manifest.json"
"""The export's manifest in its directory (Bulk Data's `output` list, types and counts)."""
NDJSON_SUFFIXES = (".ndjson", ".ndjson.gz")
SHARED_TYPES = frozenset({"Medication", "Location"})
"""Resources of no patient that patients' resources reference and the mapping reads."""
MAX_LINE_BYTES = 16 * 1024 * 1024
"""A longer line is counted as unreadable and skipped (no resource the mapping reads is near)."""
MAX_JSON_DEPTH = 100
"""A line nested deeper (arrays and objects) is counted as unreadable and skipped, before it is
parsed (FHIR resources nest about ten deep; a QuestionnaireResponse's items some more)."""
OTHER_TYPE = "(other)"
"""`not_read`'s count of resources whose `resourceType` FHIR R4 does not name."""
GZIP_RATIO = 8
"""The assumed inflation of a gzip file whose trailer cannot tell its size (over 4 GiB)."""
MAX_GZIP_RATIO = 1032
"""Deflate's largest inflation: a trailer claiming more (a damaged or hostile file) is not
believed, so no file sets the bucket count beyond what its bytes can hold."""
FHIR_ID = re.compile(r"[A-Za-z0-9\-.]{1,64}")
"""FHIR's `id` datatype: what a patient id may be (it names files' lines, never paths)."""
PARTITION_FILE = "partition.json"
PATIENTS_FILE = "patients.tsv"
SHARED_FILE = "shared.sqlite"
ISSUES_FILE = "fhir_issues.ndjson"
ISSUE_EXAMPLES = 5
"""Issues quoted in the counts (all of them are in the issues file)."""


class ExportError(ValueError):
    """An export directory that cannot be read: no NDJSON file, or a manifest naming a file the
    directory lacks (an unfinished download)."""


@dataclass(frozen=True)
class ExportFile:
    """One NDJSON file of an export, with its manifest entry's type and count when it has one."""

    path: Path
    resource_type: str | None = None
    count: int | None = None


def export_files(export_dir: Path) -> list[ExportFile]:
    """The NDJSON files of an export directory: its manifest's, else all in name order."""
    export_dir = Path(export_dir)
    manifest = export_dir / MANIFEST
    if manifest.is_file():
        try:
            outputs = json.loads(manifest.read_text(encoding="utf-8"))["output"]
            entries = [(o["url"], o.get("type"), o.get("count")) for o in outputs]
        except (ValueError, KeyError, TypeError) as exc:
            raise ExportError(f"{manifest}: not a Bulk Data manifest ({exc})") from exc
        files = []
        for url, resource_type, count in entries:
            path = export_dir / Path(urlparse(str(url)).path).name
            if not path.is_file():
                raise ExportError(f"{manifest} lists {url}, which {export_dir} lacks")
            files.append(ExportFile(path, resource_type, count))
        return files
    files = [
        ExportFile(path)
        for path in sorted(export_dir.iterdir())
        if path.is_file() and path.name.endswith(NDJSON_SUFFIXES)
    ]
    if not files:
        raise ExportError(f"{export_dir}: no {' or '.join(NDJSON_SUFFIXES)} file")
    return files


def estimated_bytes(path: Path) -> int:
    """A file's NDJSON size: its size, or a gzip file's from its trailer (the size modulo 4 GiB,
    so `GZIP_RATIO` times the compressed size where the trailer is smaller than that; at most
    `MAX_GZIP_RATIO` times it)."""
    size = path.stat().st_size
    if not path.name.endswith(".gz") or size < 4:
        return size
    with path.open("rb") as file:
        file.seek(-4, os.SEEK_END)
        (inflated,) = struct.unpack("<I", file.read(4))
    return min(inflated if inflated >= size else size * GZIP_RATIO, size * MAX_GZIP_RATIO)


_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_DEPTH_STEP = np.zeros(256, np.int8)
_DEPTH_STEP[list(b"[{")] = 1
_DEPTH_STEP[list(b"]}")] = -1


def nested_deeper_than(text: bytes, limit: int) -> bool:
    """Whether JSON `text` nests arrays and objects more than `limit` deep (brackets inside
    strings not counted), found without parsing it: no recursion, linear in its length."""
    if text.count(b"[") + text.count(b"{") <= limit:
        return False
    outside = np.frombuffer(_JSON_STRING.sub(b"", text), np.uint8)
    return bool(outside.size) and int(np.cumsum(_DEPTH_STEP[outside], dtype=np.int64).max()) > limit


def read_lines(path: Path) -> Iterator[tuple[int, bytes | None]]:
    """(line number from 1, the line without its end) of an NDJSON file, gzip read as a stream;
    a line over `MAX_LINE_BYTES` is given as None (and skipped to its end)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as file:
        number = 0
        while True:
            line = file.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            number += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while (rest := file.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    pass
                yield number, None
                continue
            yield number, line.rstrip(b"\r\n")


class _Head(msgspec.Struct):
    """What the grouping reads of a resource: type, id, the patient and shared references."""

    resourceType: object = None
    id: object = None
    subject: object = None
    patient: object = None
    medicationReference: object = None
    location: object = None


_HEAD = msgspec.json.Decoder(_Head)


def _reference(value: object) -> str | None:
    reference = value.get("reference") if isinstance(value, dict) else None
    return reference if isinstance(reference, str) else None


def referenced_id(reference: str | None, resource_type: str) -> str | None:
    """The id a reference gives a resource of `resource_type` (`Type/id`, an absolute URL ending
    in it, with or without `/_history/<version>`); None when it names another type."""
    if not reference:
        return None
    parts = reference.split("/_history/")[0].rstrip("/").split("/")
    if len(parts) >= 2 and parts[-2] == resource_type:
        return parts[-1]
    return None


def _shared_references(head: _Head) -> list[str]:
    """`Type/id` of the Medication and Location resources a resource references (those the
    mapping resolves: a medication's `medicationReference`, an Encounter's locations)."""
    found = []
    medication = referenced_id(_reference(head.medicationReference), "Medication")
    if medication is not None:
        found.append(f"Medication/{medication}")
    if isinstance(head.location, list):
        for place in head.location:
            location = isinstance(place, dict) and referenced_id(
                _reference(place.get("location")), "Location"
            )
            if location:
                found.append(f"Location/{location}")
    return [key for key in found if FHIR_ID.fullmatch(key.split("/", 1)[1])]


class Line(NamedTuple):
    """One resource as the export holds it: its file (index in the partition's files), line
    number and JSON text; `refs`: the shared resources it references (`Type/id`)."""

    file: int
    line: int
    refs: tuple[str, ...]
    text: bytes


@dataclass
class ExportCounts:
    """What one pass over an export read (the job's summary reports it)."""

    files: int = 0
    bytes: int = 0
    lines: int = 0
    grouped: dict[str, int] = field(default_factory=dict)
    """Resources written to a bucket, by type."""
    shared: dict[str, int] = field(default_factory=dict)
    """Medication and Location resources kept for reference."""
    not_read: dict[str, int] = field(default_factory=dict)
    """Resources of types the mapping does not read, by type (left out)."""
    patients: int = 0
    """Patients with a resource (a Patient resource or a reference)."""
    without_patient_resource: int = 0
    """Of those, patients only referenced (no Patient resource in the export)."""
    issues: dict[str, int] = field(default_factory=dict)
    """Lines left out, by reason (each with its file and line in the issues file)."""
    issue_examples: list[dict[str, Any]] = field(default_factory=list)
    manifest_counts: dict[str, list[int]] = field(default_factory=dict)
    """Files whose line count differs from their manifest `count`: [manifest, read]."""
    seconds: float = 0.0

    @property
    def resources_per_s(self) -> float | None:
        """Lines read per second of the pass."""
        return self.lines / self.seconds if self.seconds > 0 else None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (with `resources_per_s`)."""
        return {**asdict(self), "resources_per_s": self.resources_per_s}


class _Issues:
    """The issues file, written as the pass finds them; counts and the first examples kept."""

    def __init__(self, path: Path, counts: ExportCounts) -> None:
        self.file: IO[str] = path.open("w", encoding="utf-8")
        self.counts = counts
        self.kinds: Counter[str] = Counter()

    def add(self, file: str, line: int, reason: str, resource_type: str | None = None) -> None:
        issue = {"file": file, "line": line, "reason": reason, "resourceType": resource_type}
        self.file.write(json.dumps(issue) + "\n")
        self.kinds[reason.split(":")[0]] += 1
        if len(self.counts.issue_examples) < ISSUE_EXAMPLES:
            self.counts.issue_examples.append(issue)

    def close(self) -> None:
        self.file.close()
        self.counts.issues = dict(self.kinds.most_common())


class SharedResources:
    """The Medication and Location resources of an export, on disk (SQLite), by `Type/id`; a
    later line of the same resource replaces an earlier one."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS shared "
            "(key TEXT PRIMARY KEY, file INTEGER, line INTEGER, text BLOB)"
        )

    def put_many(self, rows: Iterable[tuple[str, int, int, bytes]]) -> None:
        """Store (key, file, line, text) rows."""
        self.db.executemany("INSERT OR REPLACE INTO shared VALUES (?, ?, ?, ?)", rows)
        self.db.commit()

    def get_many(self, keys: Sequence[str]) -> list[Line]:
        """The stored resources of `keys` that exist, in `keys`' order."""
        if not keys:
            return []
        marks = ",".join("?" * len(keys))
        found = {
            key: Line(file, line, (), bytes(text))
            for key, file, line, text in self.db.execute(
                f"SELECT key, file, line, text FROM shared WHERE key IN ({marks})", list(keys)
            )
        }
        return [found[key] for key in keys if key in found]

    def close(self) -> None:
        """Close the database."""
        self.db.close()


@dataclass(frozen=True)
class PatientResources:
    """One patient's resources: its own, then the shared ones they reference."""

    lines: list[Line]

    @property
    def texts(self) -> list[bytes]:
        """The resources' JSON texts (`meds_from_fhir`'s and `FhirWindow`'s input)."""
        return [line.text for line in self.lines]

    def bundle(self) -> dict[str, Any]:
        """The resources as a searchset Bundle (`fullUrl` `Type/id`), as `/predict` takes one."""
        entries = []
        for index, text in enumerate(self.texts):
            resource = json.loads(text)
            full_url = f"{resource['resourceType']}/{resource.get('id', index)}"
            entries.append({"fullUrl": full_url, "resource": resource})
        return {"resourceType": "Bundle", "type": "searchset", "entry": entries}


_RECORD = struct.Struct("<IIIQII")
"""A bucket record's head: the lengths of the patient id and the resource key, the file index and
line number, the lengths of the shared references and of the line; the four follow it."""


def bucket_record(
    patient: bytes, key: bytes, file: int, line: int, refs: bytes, text: bytes
) -> bytes:
    """One bucket record (`_RECORD` then its four byte strings, as they are)."""
    head = _RECORD.pack(len(patient), len(key), file, line, len(refs), len(text))
    return b"".join((head, patient, key, refs, text))


def _bucket_of(patient: str, n_buckets: int) -> int:
    return zlib.crc32(patient.encode()) % n_buckets


def subject_of(patient: str, patient_text: bytes | None, mapping: SiteMapping) -> int:
    """A patient's MEDS subject id as its whole record gives it (`meds_from_fhir`): from its
    Patient resource when it has one, else from the referenced id. The mapping's errors on the
    Patient resource are raised (the caller falls back on `subject_of(patient, None, ...)`)."""
    texts = [patient_text] if patient_text is not None else []
    return meds_from_fhir(texts, mapping=mapping, patient_id=patient).subject_id


@dataclass(frozen=True)
class Partition:
    """An export written into bucket files under `work_dir` (see the module docstring)."""

    work_dir: Path
    n_buckets: int
    files: tuple[str, ...]
    """The export's files (paths), by the index a `Line` names."""
    counts: ExportCounts

    def bucket_path(self, bucket: int) -> Path:
        """Where bucket `bucket` lies."""
        return self.work_dir / f"bucket-{bucket:05d}.bin"

    def subjects(self) -> dict[str, int]:
        """Every patient's subject id, by patient id (sorted by id)."""
        subjects = {}
        with (self.work_dir / PATIENTS_FILE).open(encoding="utf-8") as file:
            for row in file:
                patient, subject = row.rstrip("\n").split("\t")
                subjects[patient] = int(subject)
        return subjects

    def bucket_of(self, patient: str) -> int:
        """The bucket holding a patient's resources."""
        return _bucket_of(patient, self.n_buckets)

    def patients_of(self, bucket: int) -> Iterator[tuple[str, PatientResources]]:
        """(patient id, resources) of every patient of a bucket, in id order."""
        with Bucket(self, bucket) as found:
            for patient in found.patients():
                resources = found.resources(patient)
                assert resources is not None
                yield patient, resources

    def where(self, line: Line) -> str:
        """`file:line` of a resource."""
        return f"{self.files[line.file]}:{line.line}"


class Bucket:
    """One bucket file opened for reading by patient: an index of where each patient's records
    lie (runs of adjacent records, 16 bytes each, made in one read of the file), their resources
    read when asked for. Memory: the index and the patient read, not the bucket."""

    def __init__(self, partition: Partition, bucket: int) -> None:
        self.partition = partition
        self.runs: dict[bytes, array[int]] = {}
        with partition.bucket_path(bucket).open("rb") as file:
            position = 0
            while head := file.read(_RECORD.size):
                patient_len, key_len, _, _, refs_len, text_len = _RECORD.unpack(head)
                patient = file.read(patient_len)
                file.seek(key_len + refs_len + text_len, os.SEEK_CUR)
                length = _RECORD.size + patient_len + key_len + refs_len + text_len
                runs = self.runs.get(patient)
                if runs is None:
                    self.runs[patient] = array("q", (position, length))
                elif runs[-2] + runs[-1] == position:
                    runs[-1] += length
                else:
                    runs.extend((position, length))
                position += length
        self.fd = os.open(partition.bucket_path(bucket), os.O_RDONLY)
        self.shared = SharedResources(partition.work_dir / SHARED_FILE)

    def __enter__(self) -> Bucket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the bucket file and the shared resources."""
        os.close(self.fd)
        self.shared.close()

    def patients(self) -> list[str]:
        """The bucket's patients, in id order."""
        return sorted(patient.decode() for patient in self.runs)

    def resources(self, patient: str) -> PatientResources | None:
        """A patient's resources (None: none in this bucket): a later row of a resource (type
        and id) replaces an earlier one; the shared resources they reference after them."""
        runs = self.runs.get(patient.encode())
        if runs is None:
            return None
        own: dict[str | int, Line] = {}
        number = 0
        for start, length in zip(runs[::2], runs[1::2], strict=True):
            data = os.pread(self.fd, length, start)
            at = 0
            while at < len(data):
                patient_len, key_len, index, line, refs_len, text_len = _RECORD.unpack_from(
                    data, at
                )
                at += _RECORD.size + patient_len
                key = data[at : at + key_len].decode()
                refs = data[at + key_len : at + key_len + refs_len].decode()
                at += key_len + refs_len
                text = data[at : at + text_len]
                at += text_len
                name: str | int = key or number
                own.pop(name, None)
                own[name] = Line(index, line, tuple(refs.split()), text)
                number += 1
        lines = list(own.values())
        keys = list(dict.fromkeys(key for line in lines for key in line.refs))
        return PatientResources(lines + self.shared.get_many(keys))


def fingerprint(files: Sequence[ExportFile], mapping_path: Path | None) -> str:
    """What a partition was made of: the files (name, size, modification time) and the mapping
    file's content; a partition of another fingerprint is not reused."""
    digest = hashlib.sha256()
    for file in files:
        stat = file.path.stat()
        digest.update(f"{file.path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    digest.update(mapping_path.read_bytes() if mapping_path is not None else b"default")
    return digest.hexdigest()[:16]


def load_partition(work_dir: Path, key: str) -> Partition | None:
    """The finished partition in `work_dir` made with fingerprint `key`, else None."""
    path = Path(work_dir) / PARTITION_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("fingerprint") != key:
        return None
    return Partition(
        Path(work_dir), data["n_buckets"], tuple(data["files"]), ExportCounts(**data["counts"])
    )


def partition_fingerprint(work_dir: Path) -> str | None:
    """The fingerprint of the partition written in `work_dir` (None: none finished)."""
    path = Path(work_dir) / PARTITION_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8")).get("fingerprint")


def n_buckets_for(files: Sequence[ExportFile], bucket_bytes: int) -> int:
    """Buckets of about `bucket_bytes` each for the export's estimated size."""
    total = sum(estimated_bytes(f.path) for f in files)
    return max(1, math.ceil(total / bucket_bytes))


class _Pass:
    """The state of one pass over an export (`partition_export`)."""

    def __init__(self, partition: Partition, mapping: SiteMapping, issues: _Issues) -> None:
        self.partition, self.mapping, self.issues = partition, mapping, issues
        self.counts = partition.counts
        self.buckets = [
            partition.bucket_path(k).open("wb", buffering=1 << 20)
            for k in range(partition.n_buckets)
        ]
        self.shared = SharedResources(partition.work_dir / SHARED_FILE)
        self.pending_shared: list[tuple[str, int, int, bytes]] = []
        self.subjects: dict[str, int] = {}
        self.referenced: set[str] = set()
        self.grouped: Counter[str] = Counter()
        self.shared_counts: Counter[str] = Counter()
        self.not_read: Counter[str] = Counter()

    def line(self, index: int, number: int, text: bytes | None) -> None:
        """Place one line of file `index`."""
        name = self.partition.files[index]
        if text is None:
            self.issues.add(name, number, f"unreadable: a line over {MAX_LINE_BYTES} bytes")
            return
        if not text.strip():
            return
        if nested_deeper_than(text, MAX_JSON_DEPTH):
            self.issues.add(name, number, f"unreadable: nested over {MAX_JSON_DEPTH} deep")
            return
        try:
            head = _HEAD.decode(text)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.issues.add(name, number, f"unreadable: not a JSON object ({exc})")
            return
        except UnicodeDecodeError as exc:
            self.issues.add(name, number, f"unreadable: not UTF-8 (byte {exc.start})")
            return
        resource_type = head.resourceType
        if not isinstance(resource_type, str):
            self.issues.add(name, number, "unreadable: no resourceType")
            return
        if resource_type not in READ_TYPES:
            self.not_read[resource_type if resource_type in R4_RESOURCE_TYPES else OTHER_TYPE] += 1
            return
        resource_id = head.id if isinstance(head.id, str) else None
        if resource_type in SHARED_TYPES:
            if resource_id is None or not FHIR_ID.fullmatch(resource_id):
                self.issues.add(
                    name, number, "no id: a shared resource without a FHIR id", resource_type
                )
                return
            self.pending_shared.append((f"{resource_type}/{resource_id}", index, number, text))
            self.shared_counts[resource_type] += 1
            if len(self.pending_shared) >= 10_000:
                self.flush_shared()
            return
        if resource_type == "Patient":
            patient = resource_id
        else:
            patient = referenced_id(_reference(head.subject), "Patient") or referenced_id(
                _reference(head.patient), "Patient"
            )
        if patient is None:
            self.issues.add(name, number, "no patient: names no Patient", resource_type)
            return
        if not FHIR_ID.fullmatch(patient):
            self.issues.add(name, number, f"no patient: {patient[:80]!r} is no FHIR id")
            return
        if resource_type == "Patient":
            self.subjects[patient] = self.patient_subject(patient, text, name, number)
        else:
            self.referenced.add(patient)
        refs = " ".join(_shared_references(head)).encode()
        key = (
            f"{resource_type}/{resource_id}"
            if resource_id and FHIR_ID.fullmatch(resource_id)
            else ""
        )
        bucket = self.buckets[self.partition.bucket_of(patient)]
        bucket.write(bucket_record(patient.encode(), key.encode(), index, number, refs, text))
        self.grouped[resource_type] += 1

    def patient_subject(self, patient: str, text: bytes, name: str, number: int) -> int:
        """A Patient's subject id; one the mapping cannot read is an issue, and the subject id
        the patient's id gives (the patient's record then fails with the mapping's error)."""
        try:
            return subject_of(patient, text, self.mapping)
        except Exception as exc:  # the mapping's error on one resource never stops the pass
            reason = f"unmappable: the Patient: {type(exc).__name__}: {exc}"[:500]
            self.issues.add(name, number, reason, "Patient")
            return subject_of(patient, None, self.mapping)

    def flush_shared(self) -> None:
        self.shared.put_many(self.pending_shared)
        self.pending_shared = []

    def finish(self) -> None:
        """Close the buckets, write the patients' subject ids, fill the counts."""
        self.flush_shared()
        self.shared.close()
        for bucket in self.buckets:
            bucket.close()
        only_referenced = self.referenced - self.subjects.keys()
        for patient in only_referenced:
            self.subjects[patient] = subject_of(patient, None, self.mapping)
        with (self.partition.work_dir / PATIENTS_FILE).open("w", encoding="utf-8") as file:
            for patient in sorted(self.subjects):
                file.write(f"{patient}\t{self.subjects[patient]}\n")
        self.counts.patients = len(self.subjects)
        self.counts.without_patient_resource = len(only_referenced)
        self.counts.grouped = dict(sorted(self.grouped.items()))
        self.counts.shared = dict(sorted(self.shared_counts.items()))
        self.counts.not_read = dict(sorted(self.not_read.items()))


def partition_export(
    files: Sequence[ExportFile],
    work_dir: Path,
    *,
    mapping: SiteMapping,
    bucket_bytes: int = DEFAULT_BUCKET_MIB * 1024 * 1024,
    key: str = "",
    issues_path: Path | None = None,
    progress: bool = True,
) -> Partition:
    """Write `files` into buckets under `work_dir` (see the module docstring), the issues into
    `issues_path` (default: `work_dir/fhir_issues.ndjson`); `key` is recorded as the partition's
    fingerprint (`load_partition`)."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / PARTITION_FILE).unlink(missing_ok=True)
    (work_dir / SHARED_FILE).unlink(missing_ok=True)
    for old in work_dir.glob("bucket-*.*"):
        old.unlink()
    start = time.perf_counter()
    names = tuple(str(f.path) for f in files)
    counts = ExportCounts(files=len(files))
    partition = Partition(work_dir, n_buckets_for(files, bucket_bytes), names, counts)
    issues = _Issues(issues_path or work_dir / ISSUES_FILE, counts)
    state = _Pass(partition, mapping, issues)
    total = sum(estimated_bytes(f.path) for f in files)
    try:
        with tqdm(
            total=total, desc="group", unit="B", unit_scale=True, disable=not progress
        ) as bar:
            for index, file in enumerate(files):
                read = 0
                try:
                    for number, text in read_lines(file.path):
                        read = number
                        try:
                            state.line(index, number, text)
                        except Exception as exc:  # one line never stops the pass
                            reason = f"unreadable: {type(exc).__name__}: {exc}"[:500]
                            issues.add(names[index], number, reason)
                        size = len(text) + 1 if text is not None else MAX_LINE_BYTES
                        counts.bytes += size
                        bar.update(size)
                except (OSError, EOFError, zlib.error) as exc:  # a damaged or truncated gzip file
                    reason = f"unreadable: the file breaks off: {type(exc).__name__}: {exc}"[:500]
                    issues.add(names[index], read + 1, reason)
                counts.lines += read
                if file.count is not None and file.count != read:
                    counts.manifest_counts[names[index]] = [file.count, read]
    finally:
        issues.close()
        state.finish()
    counts.seconds = time.perf_counter() - start
    record = {
        "fingerprint": key,
        "n_buckets": partition.n_buckets,
        "files": list(names),
        "counts": asdict(counts),
    }
    (work_dir / PARTITION_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return partition


def patient_bundles(
    export_dir: Path, mapping: SiteMapping | None = None, bucket_bytes: int | None = None
) -> Iterator[dict[str, Any]]:
    """One searchset Bundle per patient of an export directory (the grouping above, in a
    temporary directory): the patient's resources and the Medication and Location resources
    they reference; patients in bucket order, then id order."""
    files = export_files(export_dir)
    with tempfile.TemporaryDirectory(prefix="medtpe-export-") as work:
        partition = partition_export(
            files,
            Path(work),
            mapping=mapping or load_site_mapping(),
            bucket_bytes=bucket_bytes or DEFAULT_BUCKET_MIB * 1024 * 1024,
            progress=False,
        )
        for bucket in range(partition.n_buckets):
            for _, resources in partition.patients_of(bucket):
                yield resources.bundle()
