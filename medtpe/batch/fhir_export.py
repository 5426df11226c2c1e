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
The lines are read by `medtpe.batch.ndjson_lines`; the bucket files and their reading by patient
are `medtpe.batch.patient_buckets`; the ids they hold are FHIR ids (`FHIR_ID`), checked here.

    partition = partition_export(export_files(Path("export")), Path("work"), mapping=mapping)
    for patient, resources in partition.patients_of(0):
        record = meds_from_fhir(resources.texts, mapping=mapping, patient_id=patient)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

import msgspec
from tqdm import tqdm

from medtpe.batch.defaults import DEFAULT_BUCKET_MIB
from medtpe.batch.fhir_resource_types import R4_RESOURCE_TYPES
from medtpe.batch.ndjson_lines import (
    MAX_JSON_DEPTH,
    MAX_LINE_BYTES,
    nested_deeper_than,
    read_lines,
)
from medtpe.batch.patient_buckets import (
    PARTITION_FILE,
    PATIENTS_FILE,
    SHARED_FILE,
    ExportCounts,
    Partition,
    SharedResources,
    bucket_record,
)
from medtpe.core.fhir import SiteMapping, load_site_mapping, meds_from_fhir
from medtpe.core.fhir.mapping import READ_TYPES

MANIFEST = "manifest.json"
"""The export's manifest in its directory (Bulk Data's `output` list, types and counts)."""
NDJSON_SUFFIXES = (".ndjson", ".ndjson.gz")
SHARED_TYPES = frozenset({"Medication", "Location"})
"""Resources of no patient that patients' resources reference and the mapping reads."""
OTHER_TYPE = "(other)"
"""`not_read`'s count of resources whose `resourceType` FHIR R4 does not name."""
GZIP_RATIO = 8
"""The assumed inflation of a gzip file whose trailer cannot tell its size (over 4 GiB)."""
MAX_GZIP_RATIO = 1032
"""Deflate's largest inflation: a trailer claiming more (a damaged or hostile file) is not
believed, so no file sets the bucket count beyond what its bytes can hold."""
FHIR_ID = re.compile(r"[A-Za-z0-9\-.]{1,64}")
"""FHIR's `id` datatype: what a patient id may be (it names files' lines, never paths)."""
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


def subject_of(patient: str, patient_text: bytes | None, mapping: SiteMapping) -> int:
    """A patient's MEDS subject id as its whole record gives it (`meds_from_fhir`): from its
    Patient resource when it has one, else from the referenced id. The mapping's errors on the
    Patient resource are raised (the caller falls back on `subject_of(patient, None, ...)`)."""
    texts = [patient_text] if patient_text is not None else []
    return meds_from_fhir(texts, mapping=mapping, patient_id=patient).subject_id


def fingerprint(files: Sequence[ExportFile], mapping_path: Path | None) -> str:
    """What a partition was made of: the files (name, size, modification time) and the mapping
    file's content; a partition of another fingerprint is not reused."""
    digest = hashlib.sha256()
    for file in files:
        stat = file.path.stat()
        digest.update(f"{file.path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    digest.update(mapping_path.read_bytes() if mapping_path is not None else b"default")
    return digest.hexdigest()[:16]


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
