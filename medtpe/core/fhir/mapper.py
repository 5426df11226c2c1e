"""`Mapper`: one record's resources mapped: each resource's patient checked, read (or counted
from its first pass) and counted, and the record's subject id."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from medtpe.core.fhir.context import MappingContext
from medtpe.core.fhir.parsing import FhirInputError, FhirWarning, Item, warning_of
from medtpe.core.fhir.readers import GLANCERS, READERS
from medtpe.core.fhir.record import STAND_IN, FhirEvent, FhirRecord, MappingCounts
from medtpe.core.fhir.resource_cache import ResourceCache
from medtpe.core.fhir.resource_read import ResourceRead
from medtpe.core.fhir.site_mapping import SiteMapping
from medtpe.core.meds.events import MAX_SUBJECT_ID, to_naive_utc


def _subject_id(patient_id: str | None, identifiers: Sequence[Any], mapping: SiteMapping) -> int:
    """The MEDS subject id of a patient (`medtpe.core.fhir.mapping`'s docstring)."""
    for identifier in identifiers:
        if mapping.is_subject_identifier(identifier.system) and _is_int(identifier.value):
            return int(identifier.value)
    if _is_int(patient_id):
        return int(patient_id or "")
    digest = hashlib.sha256((patient_id or "").encode()).digest()
    return int.from_bytes(digest[:6], "big")


_MAX_SUBJECT_DIGITS = len(str(MAX_SUBJECT_ID))


def _is_int(text: str | None) -> bool:
    """Whether `text` is a subject id: ASCII digits only (`str.isdigit` also takes `²`, which
    `int` refuses), no longer than the largest id, at most `MAX_SUBJECT_ID`."""
    if not text or len(text) > _MAX_SUBJECT_DIGITS or not (text.isascii() and text.isdigit()):
        return False
    return int(text) <= MAX_SUBJECT_ID


class Mapper(MappingContext):
    """One call of `meds_from_fhir`: each resource's patient checked, read (or counted from its
    first pass) and counted into the record."""

    def __init__(
        self, reads: list[ResourceRead], items: list[Item], mapping: SiteMapping, in_bundle: bool
    ) -> None:
        super().__init__(reads, items, mapping, in_bundle)
        self.owners: dict[tuple[tuple[str, str], ...], tuple[str | None, str | None]] = {}

    def read(self, i: int) -> tuple[list[FhirEvent], bool, list[tuple[str, str]], bool]:
        """Read the `i`-th resource: (events, mapped by a rule, the descriptions it gives, whether
        it looked at another resource)."""
        read = self.reads[i]
        self.looked_elsewhere, self.described = False, []
        events, mapped = READERS[read.resource_type](self, self.entry(i))
        return events, mapped, self.described, self.looked_elsewhere

    def glance(self, i: int) -> tuple[list[FhirEvent], bool, bool] | None:
        """Count the `i`-th resource from its first pass (`medtpe.core.fhir.glance`): (its
        events as stand-ins at their times, mapped by a rule, whether it looked at another
        resource), raising the errors of `read` that the first pass's fields show; None when
        only reading it can count it."""
        read = self.reads[i]
        self.looked_elsewhere = False
        counted = GLANCERS[read.resource_type](self, self.entry(i), read.glance)
        if counted is None:
            return None
        times, mapped = counted
        return [FhirEvent(t, STAND_IN) for t in times], mapped, self.looked_elsewhere

    # --- patient ------------------------------------------------------------------------------

    def patient_of(self, read: ResourceRead) -> tuple[str | None, str | None]:
        """(the patient id a resource belongs to, the field that says so); (None, None) when it
        names no patient (a type the mapping does not read names none)."""
        if read.resource_type == "Patient":
            return read.resource_id, "id"
        if not read.references:
            return None, None
        owner = self.owners.get(read.references)
        if owner is None:
            owner = self.owners[read.references] = self._owner(read.references)
        return owner

    def _owner(self, references: tuple[tuple[str, str], ...]) -> tuple[str | None, str | None]:
        for name, reference in references:
            target = self.resolve(reference)
            if target is not None and target.resource_type == "Patient":
                return target.resource_id, f"{name}.reference"
            parts = reference.split("/_history/")[0].rstrip("/").split("/")
            if len(parts) >= 2 and parts[-2] == "Patient":
                return parts[-1], f"{name}.reference"
        return None, None

    def the_patient(self, patient_id: str | None) -> str | None:
        """The record's patient id: `patient_id`, else the one Patient (or referenced one)."""
        if patient_id is not None:
            return patient_id
        patients = [i for i, read in enumerate(self.reads) if read.resource_type == "Patient"]
        if len(patients) > 1:
            raise self.error(
                self.entry(patients[1]), "more than one Patient: the input holds one record", "id"
            )
        if patients:
            return self.reads[patients[0]].resource_id
        referenced = {self.patient_of(read)[0] for read in self.reads} - {None}
        if len(referenced) > 1:
            raise FhirInputError(
                f"resources of {len(referenced)} patients and no Patient resource: give the "
                "patient id"
            )
        return next(iter(referenced), None)

    # --- the record ---------------------------------------------------------------------------

    def record(
        self,
        texts: Sequence[bytes | None],
        known: Sequence[ResourceRead | None],
        patient_id: str | None,
        prediction_time: datetime | None,
        cache: ResourceCache | None,
    ) -> FhirRecord:
        """The record of these reads: each resource's patient checked, read (or counted from its
        first pass: a stand-in) and counted; `known`: what `cache` held of each text (the
        others are added to it)."""
        patient = self.the_patient(patient_id)
        cutoff = to_naive_utc(prediction_time) if prediction_time is not None else None
        counts = MappingCounts()
        descriptions: dict[str, str] = {}
        subject_id: int | None = None
        kept: list[FhirEvent] = []
        stand_ins: list[datetime] = []
        warnings: list[FhirWarning] = []
        learned: list[tuple[bytes, ResourceRead]] = []
        for i, read in enumerate(self.reads):
            owner, where = self.patient_of(read)
            if owner is not None and patient is not None and owner != patient:
                entry = self.entry(i)
                raise self.error(entry, f"belongs to another patient than {patient!r}", where)
            if read.resource_type == "Patient":
                identifiers = read.resource.identifier or [] if read.resource else []
                subject_id = _subject_id(read.resource_id, identifiers, self.mapping)
            counted = counts.of(read.resource_type)
            counted.outside_window += read.stand_in
            counted.dropped_elements += len(read.dropped)
            index = self.items[i][0]
            warnings += [
                warning_of(index, read.resource_type, read.resource_id, d, self.in_bundle)
                for d in read.dropped
            ]
            text = texts[i] if known[i] is not read else None  # new to the cache
            if read.skipped:
                counted.skipped += 1
                if text is not None:
                    learned.append((text, read.learned((), False, (), False)))
                continue
            events, mapped, described = read.events, read.mapped, read.described
            if events is None:
                if read.stand_in:
                    glanced = self.glance(i)
                    assert glanced is not None  # a window reads what its first pass cannot count
                    events, mapped, looked_elsewhere = glanced
                    described = []
                else:
                    events, mapped, described, looked_elsewhere = self.read(i)
                read = read.learned(events, mapped, described, looked_elsewhere)
            if text is not None:
                learned.append((text, read))
            for code, description in described:
                descriptions.setdefault(code, description)
            if not events:
                counted.skipped += 1
                continue
            shown = events
            if cutoff is not None:
                shown = [e for e in events if e.time is None or e.time <= cutoff]
            if not shown:
                counted.after_prediction_time += 1
                continue
            if mapped:
                counted.mapped += 1
            else:
                counted.unmapped += 1
            if read.stand_in:
                stand_ins.extend(e.time for e in shown if e.time is not None)
            else:
                kept.extend(shown)
        if cache is not None and learned:
            cache.put_many(learned)
        if subject_id is None:  # the patient is only referenced
            subject_id = _subject_id(patient, [], self.mapping)
        return FhirRecord(subject_id, patient, kept, descriptions, counts, stand_ins, warnings)
