"""`medtpe predict --fhir DIR`: every patient of a FHIR Bulk Data export scored by the batch job of
`medtpe.batch.job`, into the same outputs as a MEDS dataset's (meds-evaluation predictions,
per-record answers and failure reasons, `summary.json`).

The export is grouped by patient on disk (`medtpe.batch.fhir_export`: one pass writes K bucket
files, chosen by a hash of the patient id); each bucket is one output shard (`bucket-00007.parquet`,
`bucket-00007.records.pq`) whose records a `FhirShards` prepares: the bucket read and grouped,
each patient's resources through the site mapping and the prompt builder exactly as `/predict`
reads a Bundle and a CDS hook its prefetch (the same record object,
`medtpe.inference.record.FhirResources`), so a patient's prompt is byte for byte theirs.

A record is a patient at each `--times` time, or a label file's row (its `subject_id` is the MEDS
subject id the mapping gives the patient: a `Patient.identifier` of the mapping's subject systems,
else the id); rows of no patient of the export are written as failures (`_no_events`).

Resumable: the partition lies in `<out>/.fhir-work/` with the fingerprint of the export's files and
the mapping; a second run with the same ones reuses it and skips the shards already written (the
predictions file is written last). When every shard is written the bucket files are removed.

`<out>/fhir_issues.ndjson` lists, each with its file and line, the lines the grouping left out
(unreadable, of no patient, a Patient the mapping cannot read) and then each record the mapping
refused (`unmappable`: the resource the error names, else the patient's first resource), rebuilt
at the end of every run from the grouping's list and one list per shard in the work directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import IO, Any

from medtpe.batch.defaults import DEFAULT_BUCKET_MIB
from medtpe.batch.fhir_export import ISSUES_FILE, export_files, fingerprint, partition_export
from medtpe.batch.job import (
    Job,
    Prepared,
    Request,
    ShardPlan,
    failed,
    limited,
    pending,
    run_plans,
)
from medtpe.batch.patient_buckets import (
    SHARED_FILE,
    Bucket,
    Partition,
    PatientResources,
    load_partition,
    partition_fingerprint,
)
from medtpe.batch.task_outputs import RECORDS_SUFFIX
from medtpe.core.fhir import FhirInputError, FhirWarning, SiteMapping, load_site_mapping
from medtpe.core.meds import read_labels
from medtpe.core.tasks import Task
from medtpe.inference.engines.factories import start_vllm
from medtpe.inference.engines.protocol import EngineFactory
from medtpe.inference.model import ModelConfig
from medtpe.inference.predictor import Predictor, PreparedRecord
from medtpe.inference.record import FhirResources, NoEventsError
from medtpe.ledger.settings import LedgerSettings

WORK_DIR = ".fhir-work"
"""The partition's directory under `--out`."""
GROUPING_ISSUES = "grouping-issues.ndjson"
"""The grouping's issues in the work directory (the start of `<out>/fhir_issues.ndjson`)."""
NO_PATIENT = "no events: the export holds no resource of the patient"
NO_FHIR_EVENTS = "no events: the patient's resources give no event up to the prediction time"
NO_EVENTS_SHARD = "_no_events"


class ExportChangedError(ValueError):
    """`--out` holds predictions of another export or mapping."""


@dataclass(frozen=True)
class FhirShardPlan(ShardPlan):
    """A bucket's records, with each record's patient id (`patients[i]` for `requests[i]`)."""

    patients: tuple[str, ...] = ()
    bucket: int | None = None
    """The bucket's index (None: label rows of no patient)."""

    def up_to(self, last: int) -> FhirShardPlan:
        """This plan with only its records (and their patients) at positions up to `last`."""
        rows = [r for r in zip(self.requests, self.patients, strict=True) if r[0].record <= last]
        return replace(self, requests=tuple(r for r, _ in rows), patients=tuple(p for _, p in rows))


@cache
def _mapping(path: Path | None) -> SiteMapping:
    return load_site_mapping(path)


def fhir_failure(error: FhirInputError, resources: PatientResources, partition: Partition) -> str:
    """A mapping error's reason, with the file and line of the resource it names."""
    where = ""
    if error.index is not None and 0 <= error.index < len(resources.lines):
        where = f"{partition.where(resources.lines[error.index])}: "
    return f"fhir: {type(error).__name__}: {where}{error}"


def shard_issues(partition: Partition, shard: str) -> Path:
    """Where the records of `shard` the mapping refused are listed."""
    return partition.work_dir / f"issues-{shard}.ndjson"


def note_dropped(
    issues: IO[str] | None,
    partition: Partition,
    patient: str,
    resources: PatientResources,
    warnings: Sequence[FhirWarning],
) -> None:
    """List each faulty element the mapping left out of a patient's resources (scored without
    it): the file and line of its resource, the patient and the fault."""
    for warning in warnings:
        index = warning.loc[0] if warning.loc and isinstance(warning.loc[0], int) else None
        note_issue(issues, partition, patient, resources, index, warning.text)


def note_issue(
    issues: IO[str] | None,
    partition: Partition,
    patient: str,
    resources: PatientResources,
    index: int | None,
    reason: str,
) -> None:
    """One line of `fhir_issues.ndjson`: the file and line of the resource at `index` (else the
    patient's first), the patient and the reason."""
    if issues is None or not resources.lines:
        return
    if index is None or not 0 <= index < len(resources.lines):
        index = 0
    line = resources.lines[index]
    issue = {
        "file": partition.files[line.file],
        "line": line.line,
        "reason": reason[:500],
        "patient": patient,
    }
    issues.write(json.dumps(issue) + "\n")


def gather_issues(partition: Partition, out_dir: Path) -> None:
    """`<out>/fhir_issues.ndjson`: the grouping's issues, then each shard's (in shard order)."""
    parts = [partition.work_dir / GROUPING_ISSUES]
    parts += sorted(partition.work_dir.glob(shard_issues(partition, "*").name))
    target = Path(out_dir) / ISSUES_FILE
    tmp = target.with_name(f".{target.name}.tmp")
    with tmp.open("wb") as out:
        for part in parts:
            if part.is_file():
                out.write(part.read_bytes())
    os.replace(tmp, target)


def prepare_patient(
    predictor: Predictor,
    tasks: Sequence[Task],
    mapping: SiteMapping,
    patient: str,
    resources: PatientResources,
    prediction_time: datetime | None,
) -> tuple[list[PreparedRecord] | None, int | None]:
    """A patient's prompt for each of `tasks` from their resources, read and rendered once for
    all of them, as `/predict` builds one from a Bundle and a hook from its prefetch
    (`medtpe.inference.record.FhirResources`), and the record's subject id; (None, None) when
    they give no event up to `prediction_time`; the mapping's `FhirInputError` is raised."""
    record = FhirResources(resources.texts, mapping, prediction_time, patient_id=patient)
    try:
        prepared = record.prepare_all(predictor, tasks)
    except NoEventsError:
        return None, None
    fhir = prepared[0].fhir
    assert fhir is not None  # FHIR resources' record
    return prepared, fhir.subject_id


@dataclass(frozen=True)
class FhirShards:
    """The `medtpe.batch.job.ShardPreparer` of a partitioned export: a bucket indexed, each
    record's patient read and prepared (a record's bad data is its failure, never the job's)."""

    partition: Partition
    mapping_path: Path | None

    def __call__(
        self, predictor: Predictor, tasks: Sequence[Task], plan: ShardPlan
    ) -> Iterator[tuple[Request, Prepared]]:
        if not plan.requests:
            return
        assert isinstance(plan, FhirShardPlan)
        with ExitStack() as stack:
            bucket: Bucket | None = None
            issues: IO[str] | None = None
            if plan.bucket is not None:
                bucket = stack.enter_context(Bucket(self.partition, plan.bucket))
                path = shard_issues(self.partition, plan.name)
                issues = stack.enter_context(path.open("w", encoding="utf-8"))
            yield from self._prepare(predictor, tasks, plan, bucket, issues)

    def _prepare(
        self,
        predictor: Predictor,
        tasks: Sequence[Task],
        plan: FhirShardPlan,
        bucket: Bucket | None,
        issues: IO[str] | None,
    ) -> Iterator[tuple[Request, Prepared]]:
        mapping = _mapping(self.mapping_path)
        for request, patient in zip(plan.requests, plan.patients, strict=True):
            resources = bucket.resources(patient) if bucket is not None else None
            if resources is None:
                yield request, failed(request, NO_PATIENT)
                continue
            try:
                prepared, subject = prepare_patient(
                    predictor, tasks, mapping, patient, resources, request.prediction_time
                )
            except FhirInputError as exc:
                reason = fhir_failure(exc, resources, self.partition)
                unmappable = f"unmappable: {reason}"
                note_issue(issues, self.partition, patient, resources, exc.index, unmappable)
                yield request, failed(request, reason)
                continue
            except Exception as exc:  # a record's bad data never stops the job
                reason = f"prepare: {type(exc).__name__}: {exc}"
                unmappable = f"unmappable: {reason}"
                note_issue(issues, self.partition, patient, resources, None, unmappable)
                yield request, failed(request, reason)
                continue
            if prepared is None:
                yield request, failed(request, NO_FHIR_EVENTS)
            elif subject != request.subject_id:  # the pass and the record disagree: never seen
                yield request, failed(request, f"prepare: subject {subject} is not the plan's")
            else:
                fhir = prepared[0].fhir
                assert fhir is not None  # FHIR resources' record
                note_dropped(issues, self.partition, patient, resources, fhir.warnings)
                yield request, prepared


def plan_buckets(partition: Partition, job: Job) -> list[FhirShardPlan]:
    """The records of each bucket (patients in id order): each patient at each of `job.times`,
    or the label file's rows by subject id (rows of no patient in a last plan `_no_events`);
    the first `job.limit` records."""
    subjects = partition.subjects()
    by_bucket: list[list[tuple[Request, str]]] = [[] for _ in range(partition.n_buckets)]
    orphans: list[tuple[Request, str]] = []
    if job.labels is None:
        record = 0
        in_order = sorted(subjects, key=lambda p: (partition.bucket_of(p), p))
        for patient in in_order:
            for when in job.times:
                request = Request(record, subjects[patient], when)
                by_bucket[partition.bucket_of(patient)].append((request, patient))
                record += 1
    else:
        patient_of: dict[int, str] = {}
        for patient, subject in subjects.items():
            patient_of.setdefault(subject, patient)
        for index, point in enumerate(read_labels(job.labels)):
            label = point.parsed(job.task).label
            request = Request(index, point.subject_id, point.prediction_time, label)
            patient = patient_of.get(point.subject_id)
            if patient is None:
                orphans.append((request, ""))
            else:
                by_bucket[partition.bucket_of(patient)].append((request, patient))
    plans = [_plan(f"bucket-{k:05d}", partition, k, rows) for k, rows in enumerate(by_bucket)]
    if orphans:
        plans.append(_plan(NO_EVENTS_SHARD, partition, None, orphans))
    return limited(plans, job.limit)


def _plan(
    name: str, partition: Partition, bucket: int | None, rows: Sequence[tuple[Request, str]]
) -> FhirShardPlan:
    rows = sorted(rows, key=lambda row: row[0].record)
    return FhirShardPlan(
        name,
        partition.bucket_path(bucket) if bucket is not None else None,
        tuple(r for r, _ in rows),
        patients=tuple(p for _, p in rows),
        bucket=bucket,
    )


@dataclass(frozen=True)
class FhirInput:
    """Where the export is and how it is read."""

    export_dirs: tuple[Path, ...]
    """Export directories read in this order as one export (a resource in a later one replaces
    its line in an earlier one: a base export, then its `_since` increments)."""
    mapping_path: Path | None = None
    """The site mapping (`MEDTPE_FHIR_MAPPING`; None: the shipped default)."""
    bucket_mib: int = DEFAULT_BUCKET_MIB


def partitioned(
    source: FhirInput, out_dir: Path, reuse: bool = True, progress: bool = True
) -> tuple[Partition, bool]:
    """The export's partition under `out_dir` (with `reuse`, the one an earlier run made of the
    same files and mapping, its bucket files perhaps removed), and whether it was reused;
    `ExportChangedError` when `out_dir` holds predictions of another export or mapping."""
    files = [file for directory in source.export_dirs for file in export_files(directory)]
    key = fingerprint(files, source.mapping_path)
    work = Path(out_dir) / WORK_DIR
    found = load_partition(work, key) if reuse else None
    if found is not None:
        return found, True
    written = any(Path(out_dir).glob(f"**/*{RECORDS_SUFFIX}"))
    if written and partition_fingerprint(work) not in (None, key):
        raise ExportChangedError(
            f"{out_dir} holds predictions of another export or site mapping: give a new --out"
        )
    if partition_fingerprint(work) != key:  # another export's lists of refused records
        for old in work.glob("issues-*.ndjson"):
            old.unlink()
    partition = partition_export(
        files,
        work,
        mapping=_mapping(source.mapping_path),
        bucket_bytes=source.bucket_mib * 1024 * 1024,
        key=key,
        issues_path=work / GROUPING_ISSUES,
        progress=progress,
    )
    return partition, False


def fhir_settings(source: FhirInput, partition: Partition, reused: bool) -> dict[str, Any]:
    """What the summary records of the export and its reading."""
    return {
        "meds": None,
        "fhir": [str(d) for d in source.export_dirs],
        "fhir_mapping": str(source.mapping_path) if source.mapping_path else "default",
        "fhir_export": {
            **partition.counts.as_dict(),
            "buckets": partition.n_buckets,
            "bucket_mib": source.bucket_mib,
            "partition_reused": reused,
        },
    }


def clean_up(
    partition: Partition, plans: Sequence[ShardPlan], out_dir: Path, tasks: Sequence[Task]
) -> None:
    """Remove the bucket files once every shard is written for every one of `tasks` (the
    partition's record stays)."""
    if not pending(plans, out_dir, tasks):
        for k in range(partition.n_buckets):
            partition.bucket_path(k).unlink(missing_ok=True)
        (partition.work_dir / SHARED_FILE).unlink(missing_ok=True)


def run_fhir(
    config: ModelConfig,
    job: Job,
    source: FhirInput,
    out_dir: Path,
    *,
    ray: Any = None,
    engine_factory: EngineFactory = start_vllm,
    ledger: LedgerSettings | None = None,
) -> dict[str, Any]:
    """Score every patient (or label row) of the export (see the module docstring), in this
    process or on Ray (`ray`: `medtpe.batch.ray_job.RayResources`), each answer recorded in
    `ledger` (default: the `MEDTPE_LEDGER_*` environment's); returns (and writes) the summary."""
    partition, reused = partitioned(source, out_dir)
    plans = plan_buckets(partition, job)
    if reused and not all(
        partition.bucket_path(p.bucket).is_file()
        for p in pending(plans, out_dir, job.tasks)
        if p.bucket is not None and p.requests
    ):  # the buckets were removed when an earlier job was done; this one asks for more
        partition, reused = partitioned(source, out_dir, reuse=False)
    prepare = FhirShards(partition, source.mapping_path)
    settings = fhir_settings(source, partition, reused)
    try:
        if ray is None:
            summary = run_plans(
                config, job, plans, prepare, out_dir, settings, engine_factory, ledger
            )
        else:
            from medtpe.batch.ray_job import run_ray

            summary = run_ray(config, job, out_dir, ray, (plans, prepare), settings, ledger)
    finally:
        gather_issues(partition, out_dir)
    clean_up(partition, plans, out_dir, job.tasks)
    return summary
