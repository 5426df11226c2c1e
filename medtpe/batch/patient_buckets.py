"""An export grouped by patient on disk (`medtpe.batch.fhir_export` writes it): K bucket files,
a patient's resources in the bucket a hash of its id chooses, the Medication and Location
resources they reference in an SQLite table (`SharedResources`), each patient's subject id in
`patients.tsv`, the pass's counts and fingerprint in `partition.json`.

A bucket file is a sequence of length-prefixed records (`_RECORD`: the lengths and positions, then
the patient id, the resource key, the shared references and the line's bytes as they are), so no
byte of a resource can break it. A bucket is read by patient (`Bucket`): indexed in one read of
the file (where each patient's rows lie, 16 bytes a run of adjacent rows), each patient's rows
read when asked for, so memory holds the index and one patient, not the bucket; a later row of
the same resource (type and id) replaces an earlier one.
"""

from __future__ import annotations

import json
import os
import sqlite3
import struct
import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

PARTITION_FILE = "partition.json"
PATIENTS_FILE = "patients.tsv"
SHARED_FILE = "shared.sqlite"


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
