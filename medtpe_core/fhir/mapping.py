"""FHIR R4 → MEDS events: one pure function of the resources and a site mapping.

    record = meds_from_fhir(bundle, mapping=load_site_mapping())
    record.events      # MedsEvent list, the same objects /predict's MEDS path validates
    record.counts      # per resource type: mapped / unmapped / after_prediction_time / skipped

What each resource gives (the site mapping's rules choose the codes):
- Patient: `birthDate` → the birth code at midnight, `gender` → a static gender code; its
  `deceased*` is never read.
- Observation: one event at `effective[x]` (an error without one, or without a code), valued by
  `valueQuantity` (number + unit), `valueInteger`, or as text (`valueString`,
  `valueCodeableConcept`, `valueBoolean`, `valueDateTime`, `valueTime`); no value is legal (an
  event without one); a `valueRange`, `valueRatio`, `valueSampledData` or `valuePeriod` is an
  error (we cannot render it); each `component` is an event of its own code.
- Condition: at `onset[x]`, else its encounter's end, else `recordedDate` (skipped without any).
- Procedure, MedicationAdministration, MedicationRequest, Encounter: events at the time or the
  period's start and end, as their rule says.
- Other resource types (Practitioner, Organization, ...) and resources `entered-in-error` are
  skipped and counted.

A coding no rule takes is kept with the mapping's generic `unmapped` code (plus `//unit` when
the value has a unit) and its display as description, and counted as unmapped. Events after
`prediction_time` are dropped (MEDS: up to and including it is used).

The subject id: an integer (ASCII digits, at most 2**53 - 1) `Patient.identifier` of a
`subject_identifier_systems` system, else an integer `Patient.id`, else the first 48 bits of the
SHA-256 of `Patient.id` (stable, JSON-safe).

Cost: linear in the resources; nearly all of it is `fhir.resources` validation
(`medtpe_core.fhir.parsing`). With a `ResourceCache`, a resource given as JSON text (`bytes`) that
the cache has seen is neither validated nor read again: what it gave is kept under the digest of
its exact text (a CDS hook re-asked about a patient after new observations arrived validates
only those). A resource whose reading looked at another one (a Condition's encounter, a
referenced Medication or Location) keeps its validated model and is read again for each record.
"""

from __future__ import annotations

import hashlib
import math
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any, NamedTuple

import numpy as np
from fhir.resources.R4B.resource import Resource

from medtpe_core.fhir.parsing import (
    Entry,
    FhirInputError,
    FhirWarning,
    Item,
    parse_resource,
    resource_items,
    warning_of,
)
from medtpe_core.fhir.site_mapping import MAPPED_TYPES, Rule, SiteMapping
from medtpe_core.meds.events import (
    MAX_SUBJECT_ID,
    MedsEvent,
    SubjectEvents,
    datetimes_to_array,
    to_naive_utc,
)

UNKNOWN = "UNK"
"""What a template placeholder becomes when the resource lacks it (the MEDS ETL's own word)."""
SKIPPED_STATUSES = frozenset({"entered-in-error", "cancelled", "not-done", "refuted"})
"""Statuses whose resource is not a fact about the patient: skipped and counted."""
UNRENDERABLE_VALUES = ("valueRange", "valueRatio", "valueSampledData", "valuePeriod")
"""Observation value types with no one-line rendering: an error naming the field."""
STAND_IN = "MEDTPE//NOT_READ"
"""The code of the stand-in events of a resource outside the window (`medtpe_core.fhir.window`):
they hold its events' times and number, and the prompt never shows them."""


@dataclass
class ResourceCounts:
    """What became of the resources of one type."""

    mapped: int = 0
    unmapped: int = 0
    after_prediction_time: int = 0
    skipped: int = 0
    outside_window: int = 0
    """Of the above, those outside the prompt's window (`medtpe_core.fhir.window`): counted by
    the first pass, not validated as R4 nor read (part of none of the totals' sums)."""
    dropped_elements: int = 0
    """Faulty elements left out of the resources read (`FhirRecord.warnings` names each)."""

    def as_dict(self) -> dict[str, int]:
        """The counts as a JSON object."""
        return {
            "mapped": self.mapped,
            "unmapped": self.unmapped,
            "after_prediction_time": self.after_prediction_time,
            "skipped": self.skipped,
            "outside_window": self.outside_window,
            "dropped_elements": self.dropped_elements,
        }


@dataclass
class MappingCounts:
    """Per resource type: mapped, unmapped (kept with a generic code), dropped after the
    prediction time, skipped (not read: another type, entered in error, no time)."""

    by_type: dict[str, ResourceCounts] = field(default_factory=dict)

    def of(self, resource_type: str) -> ResourceCounts:
        """The counts of one type (created empty)."""
        return self.by_type.setdefault(resource_type, ResourceCounts())

    def as_dict(self) -> dict[str, dict[str, int]]:
        """`{resource type: {mapped, unmapped, after_prediction_time, skipped,
        outside_window, dropped_elements}}`, types sorted."""
        return {name: self.by_type[name].as_dict() for name in sorted(self.by_type)}

    @property
    def n_resources(self) -> int:
        """All resources counted."""
        return sum(
            c.mapped + c.unmapped + c.after_prediction_time + c.skipped
            for c in self.by_type.values()
        )


class FhirEvent(NamedTuple):
    """One event a resource gives: its time (None: static), code, number and text."""

    time: datetime | None
    code: str
    value: float | None = None
    text: str | None = None


@dataclass(frozen=True)
class FhirRecord:
    """One patient's FHIR resources as MEDS events, in the resources' order.

    `descriptions` holds the codes' descriptions the mapping carries (display text of rules
    with `describe` and of unmapped codings); the site's codes metadata takes precedence.
    `stand_ins`: the times of the events of the resources outside the window (none unless
    `medtpe_core.fhir.window` chose one), each before `horizon`. `warnings`: each faulty
    element left out of a resource read (`medtpe_core.fhir.parsing.parse_resource`)."""

    subject_id: int
    patient_id: str | None
    rows: list[FhirEvent]
    descriptions: dict[str, str]
    counts: MappingCounts
    stand_ins: list[datetime] = field(default_factory=list)
    warnings: list[FhirWarning] = field(default_factory=list)

    @property
    def horizon(self) -> datetime | None:
        """The newest stand-in's time (None: every resource was read): a prompt of this record
        is the whole record's when it shows and depends on no event at or before it
        (`medtpe_core.prompt.task_prompt.build_prompt`'s `horizon`)."""
        return max(self.stand_ins) if self.stand_ins else None

    @property
    def events(self) -> list[MedsEvent]:
        """The events as validated MEDS events (in the resources' order)."""
        return [
            MedsEvent(
                subject_id=self.subject_id,
                time=e.time,
                code=e.code,
                numeric_value=e.value,
                text_value=e.text,
            )
            for e in self.rows
        ]

    def subject_events(self) -> SubjectEvents:
        """The events as sorted columns, as `SubjectEvents.from_events(self.events)` gives them,
        built without a model per event (the mapping writes naive times and finite numbers);
        with a `STAND_IN` event at each of `stand_ins`."""
        rows = self.rows + [FhirEvent(t, STAND_IN) for t in self.stand_ins]
        return SubjectEvents.from_columns(
            self.subject_id,
            datetimes_to_array([e.time for e in rows]),
            [e.code for e in rows],
            np.array([e.value for e in rows], dtype=np.float64),  # None -> NaN
            [e.text for e in rows],
        )


def _time(value: object) -> datetime | None:
    """A FHIR date / dateTime / instant as a naive UTC datetime (a date: its midnight)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return to_naive_utc(value)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    return None


def _number(value: object) -> float | None:
    if value is None:
        return None
    number = float(value) if isinstance(value, Decimal | int | float) else math.nan
    return number if math.isfinite(number) else None


def _codings(concept: Any) -> list[tuple[str | None, str | None, str | None]]:
    """(system, code, display) of a CodeableConcept; its text alone as a `text` coding."""
    if concept is None:
        return []
    codings = [(c.system, c.code, c.display) for c in concept.coding or [] if c.code]
    if not codings and concept.text:
        codings = [("text", concept.text, concept.text)]
    return codings


def _first_code(concept: Any) -> str | None:
    codings = _codings(concept)
    return codings[0][1] if codings else None


def _subject_id(patient_id: str | None, identifiers: Sequence[Any], mapping: SiteMapping) -> int:
    """The MEDS subject id of a patient (see the module docstring)."""
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


class _Slots(dict[str, str]):
    """Template values; a missing one is `UNK` (a rule may name a slot its type lacks)."""

    def __missing__(self, key: str) -> str:
        return UNKNOWN


@dataclass(slots=True)
class _Read:
    """What one resource gives, whatever record it is in (a `ResourceCache` keeps it under the
    resource's JSON text). `events` None: not read yet, or read again for each record because its
    reading looked at another resource. `resource`, the validated model, is kept while a reading
    may need it: before the resource is read, when it is read for each record, and for the types
    other resources' readings look into (`_KEPT_MODELS`). Never changed once made (a cache
    shares it; `learned` makes another); not `frozen`, whose constructor costs 4x: the first
    pass makes two for each resource of a record."""

    resource_type: str
    resource_id: str | None
    resource: Resource | None
    references: tuple[tuple[str, str], ...]  # (field, reference) that may name its patient
    skipped: bool
    key: str | None  # `Type/id`, how references name it
    events: tuple[FhirEvent, ...] | None = None
    mapped: bool = False
    described: tuple[tuple[str, str], ...] = ()
    period_end: datetime | None = None  # an Encounter's: a Condition without onset is then
    glance: Any = None  # the first pass's fields (`medtpe_core.fhir.glance`), not yet counted
    stand_in: bool = False  # only glanced: `events` are stand-ins (time, `STAND_IN` code)
    dropped: tuple[tuple[str, str], ...] = ()  # faulty elements left out (`Entry.dropped`)

    @classmethod
    def of(cls, entry: Entry) -> _Read:
        """A parsed resource, not yet read."""
        read = cls._new(entry.resource_type, entry.resource_id, entry.resource)
        read.dropped = entry.dropped
        return read

    @classmethod
    def glanced(cls, resource_type: str, resource_id: str | None, glance: Any) -> _Read:
        """A resource of the first pass only (`medtpe_core.fhir.glance`), not yet counted."""
        return cls._new(resource_type, resource_id, glance, glanced=True)

    @classmethod
    def _new(
        cls, resource_type: str, resource_id: str | None, resource: Any, glanced: bool = False
    ) -> _Read:
        references: tuple[tuple[str, str], ...] = ()
        if resource is not None and resource_type != "Patient":
            references = tuple(
                (name, ref.reference)
                for name in ("subject", "patient")
                if (ref := getattr(resource, name, None)) is not None
                and getattr(ref, "reference", None)
            )
        skipped = resource_type not in _READERS or _status(resource) in SKIPPED_STATUSES
        key = f"{resource_type}/{resource_id}" if resource_id else None
        period_end = None
        if resource_type == "Encounter" and resource is not None:
            period_end = _period(resource.period)[1]
        return cls(
            resource_type,
            resource_id,
            None if glanced else resource,
            references,
            skipped,
            key,
            period_end=period_end,
            glance=resource if glanced else None,
            stand_in=glanced,
        )

    def learned(
        self,
        events: Sequence[FhirEvent],
        mapped: bool,
        described: Sequence[tuple[str, str]],
        looked_elsewhere: bool,
    ) -> _Read:
        """This resource once read (or glanced: stand-in events), as a cache keeps it."""
        if looked_elsewhere:
            return self
        resource = self.resource if self.resource_type in _KEPT_MODELS else None
        return _Read(
            self.resource_type,
            self.resource_id,
            resource,
            self.references,
            self.skipped,
            self.key,
            tuple(events),
            mapped,
            tuple(described),
            self.period_end,
            None,
            self.stand_in,
            self.dropped,
        )


class _Mapper:
    """One call of `meds_from_fhir`: the input's resources and their index by reference."""

    def __init__(
        self, reads: list[_Read], items: list[Item], mapping: SiteMapping, in_bundle: bool
    ) -> None:
        self.reads = reads
        self.items = items
        self.mapping = mapping
        self.in_bundle = in_bundle
        self._by_reference: dict[str, _Read] | None = None
        self.owners: dict[tuple[tuple[str, str], ...], tuple[str | None, str | None]] = {}
        self.looked_elsewhere = False  # the reading under way resolved a reference
        self.described: list[tuple[str, str]] = []  # the reading under way's descriptions
        self._rules: dict[tuple[str, tuple[str | None, ...], str | None], Any] = {}
        """`SiteMapping.rule_for` by (type, code systems, class): a rule takes a coding by its
        system, and a record repeats a few systems thousands of times."""

    def entry(self, i: int) -> Entry:
        """The `i`-th resource as an entry (its place in the input, its model)."""
        read, (index, full_url, _) = self.reads[i], self.items[i]
        resource = read.resource
        return Entry(index, full_url, read.resource_type, read.resource_id, resource, read.dropped)

    def error(self, entry: Entry, message: str, field: str | None) -> FhirInputError:
        """The error of a resource the mapping cannot read, naming the faulty element it needs
        when that was left out (`Entry.dropped`)."""
        fault = dict(entry.dropped).get(field or "")
        return FhirInputError(
            f"{message} ({field} left out: {fault})" if fault else message,
            index=entry.index,
            resource_type=entry.resource_type,
            resource_id=entry.resource_id,
            field=field,
            in_bundle=self.in_bundle,
        )

    def read(self, i: int) -> tuple[list[FhirEvent], bool, list[tuple[str, str]], bool]:
        """Read the `i`-th resource: (events, mapped by a rule, the descriptions it gives, whether
        it looked at another resource)."""
        read = self.reads[i]
        self.looked_elsewhere, self.described = False, []
        events, mapped = _READERS[read.resource_type](self, self.entry(i))
        return events, mapped, self.described, self.looked_elsewhere

    def glance(self, i: int) -> tuple[list[FhirEvent], bool, bool] | None:
        """Count the `i`-th resource from its first pass (`medtpe_core.fhir.glance`): (its
        events as stand-ins at their times, mapped by a rule, whether it looked at another
        resource), raising the errors of `read` that the first pass's fields show; None when
        only reading it can count it."""
        read = self.reads[i]
        self.looked_elsewhere = False
        counted = _GLANCERS[read.resource_type](self, self.entry(i), read.glance)
        if counted is None:
            return None
        times, mapped = counted
        return [FhirEvent(t, STAND_IN) for t in times], mapped, self.looked_elsewhere

    @property
    def by_reference(self) -> dict[str, _Read]:
        """The resources by `Type/id` and by `fullUrl` (built on first use)."""
        if self._by_reference is None:
            if any(full_url for _, full_url, _ in self.items):
                index: dict[str, _Read] = {}
                for read, (_, full_url, _) in zip(self.reads, self.items, strict=True):
                    if read.key:
                        index[read.key] = read
                    if full_url:
                        index[full_url] = read
            else:  # a list of resources (a hook's prefetch): one pass in C
                index = {read.key: read for read in self.reads if read.key}
            self._by_reference = index
        return self._by_reference

    def resolve(self, reference: str | None) -> _Read | None:
        """The resource a reference points to (`Type/id`, an absolute URL ending in it, a
        fullUrl)."""
        self.looked_elsewhere = True
        if not reference:
            return None
        found = self.by_reference.get(reference)
        if found is None and "/_history/" in reference:
            found = self.by_reference.get(reference.split("/_history/")[0])
        if found is None:
            parts = reference.rstrip("/").split("/")
            if len(parts) >= 2:
                found = self.by_reference.get(f"{parts[-2]}/{parts[-1]}")
        return found

    # --- patient ------------------------------------------------------------------------------

    def patient_of(self, read: _Read) -> tuple[str | None, str | None]:
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
        known: Sequence[_Read | None],
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
        learned: list[tuple[bytes, _Read]] = []
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

    # --- codes --------------------------------------------------------------------------------

    def rule(
        self,
        entry: Entry,
        resource_type: str,
        concept: Any,
        field: str,
        encounter_class: str | None = None,
    ) -> tuple[tuple[Rule, int] | None, list[tuple[str | None, str | None, str | None]]]:
        """(the rule that takes the concept and the index of the coding it took, or None; the
        concept's codings); an error when it has no code (and no Encounter class)."""
        codings = _codings(concept)
        if not codings and encounter_class is None:
            raise self.error(entry, "a code is required", field)
        key = (resource_type, tuple(system for system, _, _ in codings), encounter_class)
        if key not in self._rules:
            pairs = [(system, code) for system, code, _ in codings]
            self._rules[key] = self.mapping.rule_for(resource_type, pairs, encounter_class)
        return self._rules[key], codings

    def coded(
        self,
        entry: Entry,
        resource_type: str,
        concept: Any,
        field: str,
        slots: Mapping[str, str],
        encounter_class: str | None = None,
    ) -> tuple[Rule | None, dict[str, str], str | None]:
        """(the rule that takes the concept or None, the template slots, the display)."""
        found, codings = self.rule(entry, resource_type, concept, field, encounter_class)
        system, code, display = codings[0] if codings else (None, None, None)
        if found is not None and found[1] >= 0:
            system, code, display = codings[found[1]]
        values = {**slots, "code": code or UNKNOWN, "system": _system_name(system)}
        values["display"] = display or code or UNKNOWN
        values["resource_type"] = resource_type.upper()
        return (found[0] if found else None), values, display

    def code_of(self, template: str, values: Mapping[str, str]) -> str:
        """The template filled in; a placeholder this resource has no value for is `UNK`."""
        return template.format_map(_Slots(values))

    def describe(self, code: str, display: str | None, unit: str | None) -> None:
        """The code's description: the display, with the unit in brackets (the renderer reads it
        from there; a UCUM unit's own brackets are dropped: `mm[Hg]` → `mmHg`). The first
        resource to describe a code sets it."""
        if display:
            shown = unit.replace("[", "").replace("]", "") if unit else None
            self.described.append((code, f"{display} [{shown}]" if shown else display))

    def unmapped(self, values: Mapping[str, str], display: str | None, unit: str | None) -> str:
        code = self.code_of(self.mapping.unmapped, values)
        if unit:
            code = f"{code}//{unit}"
        self.describe(code, display, unit)
        return code


def _system_name(system: str | None) -> str:
    """A code system URL's last path segment (`http://loinc.org` → `loinc.org`)."""
    if not system:
        return UNKNOWN
    return system.rstrip("/").rsplit("/", 1)[-1].removeprefix("urn:oid:") or UNKNOWN


def _quantity_unit(quantity: Any) -> str | None:
    if quantity is None:
        return None
    return quantity.unit or quantity.code or None


def _check_renderable(mapper: _Mapper, entry: Entry, part: Any, prefix: str) -> None:
    """An error for an Observation (or component) value type we cannot render."""
    for name in UNRENDERABLE_VALUES:
        if getattr(part, name, None) is not None:
            raise mapper.error(entry, "a value of this type cannot be rendered", prefix + name)


def _observation_value(
    mapper: _Mapper, entry: Entry, resource: Any, prefix: str = ""
) -> tuple[float | None, str | None, str | None]:
    """(number, text, unit) of an Observation or component value; an error for a value type we
    cannot render."""
    _check_renderable(mapper, entry, resource, prefix)
    if resource.valueQuantity is not None:
        quantity = resource.valueQuantity
        return _number(quantity.value), None, _quantity_unit(quantity)
    if resource.valueInteger is not None:
        return float(resource.valueInteger), None, None
    if resource.valueCodeableConcept is not None:
        concept = resource.valueCodeableConcept
        codings = _codings(concept)
        text = concept.text or (codings[0][2] or codings[0][1] if codings else None)
        return None, text, None
    if resource.valueString is not None:
        return None, resource.valueString, None
    if resource.valueBoolean is not None:
        return None, "yes" if resource.valueBoolean else "no", None
    for name in ("valueDateTime", "valueTime"):
        value = getattr(resource, name, None)
        if value is not None:
            return None, value.isoformat(), None
    return None, None, None


def _observation_time(mapper: _Mapper, entry: Entry, obs: Any) -> datetime:
    """An Observation's time: `effective[x]` (a period's start); an error without one."""
    time = _time(obs.effectiveDateTime or obs.effectiveInstant)
    if time is None and obs.effectivePeriod is not None:
        time = _time(obs.effectivePeriod.start)
    if time is None:
        raise mapper.error(entry, "an Observation needs a time (effective[x])", "effectiveDateTime")
    return time


def _observation_parts(obs: Any) -> list[tuple[Any, str]]:
    """The parts of an Observation that are events, with their field prefix: itself, then each
    component (a panel without a value of its own: only its components)."""
    parts = [] if obs.component and not _has_value(obs) else [(obs, "")]
    return parts + [(c, f"component.{i}.") for i, c in enumerate(obs.component or [])]


def _observation(mapper: _Mapper, entry: Entry) -> tuple[list[FhirEvent], bool]:
    obs = entry.resource
    time = _observation_time(mapper, entry, obs)
    events: list[FhirEvent] = []
    mapped = True
    for part, prefix in _observation_parts(obs):
        number, text, unit = _observation_value(mapper, entry, part, prefix)
        rule, values, display = mapper.coded(
            entry, "Observation", part.code, prefix + "code", {"unit": unit or UNKNOWN}
        )
        if rule is None or rule.code is None:
            code, mapped = mapper.unmapped(values, display, unit), False
        else:
            code = mapper.code_of(rule.code, values)
            if rule.describe:
                mapper.describe(code, display, unit)
        events.append(FhirEvent(time, code, number, text))
    return events, mapped


def _observation_glance(mapper: _Mapper, entry: Entry, obs: Any) -> Counted:
    time = _observation_time(mapper, entry, obs)
    times, mapped = [], True
    for part, prefix in _observation_parts(obs):
        _check_renderable(mapper, entry, part, prefix)
        found, _ = mapper.rule(entry, "Observation", part.code, prefix + "code")
        mapped = mapped and found is not None and found[0].code is not None
        times.append(time)
    return times, mapped


def _has_value(obs: Any) -> bool:
    return any(getattr(obs, name) is not None for name in _VALUES)


_VALUES = (
    "valueQuantity",
    "valueInteger",
    "valueCodeableConcept",
    "valueString",
    "valueBoolean",
    "valueDateTime",
    "valueTime",
    *UNRENDERABLE_VALUES,
)

Times = tuple[datetime | None, datetime | None, datetime | None]
"""A resource's (time, period start, period end), as a rule places its events (`_fires`)."""
Counted = tuple[list[datetime], bool]
"""What the first pass learns of a resource: its events' times and whether a rule maps it."""


def _fires(
    rule: Rule | None, at: datetime | None, start: datetime | None, end: datetime | None
) -> list[tuple[str | None, datetime, str | None]]:
    """(template, time, value field) of each event a rule makes: `code` at `at` (else `start`),
    `start` / `end` at the period's ends; no rule: one event (no template) at `at` / `start`."""
    if rule is None:
        when = at or start
        return [(None, when, None)] if when else []
    return [
        (template, when, value_name)
        for template, when, value_name in (
            (rule.code, at or start, None),
            (rule.start, start or at, rule.start_value),
            (rule.end, end, rule.end_value),
        )
        if template is not None and when is not None
    ]


def _timed_events(
    mapper: _Mapper,
    rule: Rule | None,
    values: dict[str, str],
    display: str | None,
    times: Times,
    value_of: Mapping[str, tuple[float | None, str | None]] | None = None,
) -> tuple[list[FhirEvent], bool]:
    """The events of a rule at `times` (`_fires`); a coding no rule takes is one unmapped
    event."""
    value_of = value_of or {}
    if rule is None:
        code = mapper.unmapped(values, display, None)
        return [FhirEvent(when, code) for _, when, _ in _fires(None, *times)], False
    events = []
    for template, when, value_name in _fires(rule, *times):
        number, unit = value_of.get(value_name or "", (None, None))
        code = mapper.code_of(template, values)
        if rule.describe:
            mapper.describe(code, display, unit)
        events.append(FhirEvent(when, code, number))
    return events, True


def _timed_glance(
    mapper: _Mapper,
    entry: Entry,
    concept: Any,
    field: str,
    times: Times,
    encounter_class: str | None = None,
) -> Counted:
    """`_timed_events`' times and whether a rule takes the concept, from the first pass."""
    found, _ = mapper.rule(entry, entry.resource_type, concept, field, encounter_class)
    rule = found[0] if found else None
    return [when for _, when, _ in _fires(rule, *times)], rule is not None


def _period(period: Any) -> tuple[datetime | None, datetime | None]:
    if period is None:
        return None, None
    return _time(period.start), _time(period.end)


def _condition_time(mapper: _Mapper, condition: Any) -> datetime | None:
    """`onset[x]`, else its encounter's end, else `recordedDate`."""
    at = _time(condition.onsetDateTime)
    if at is None and condition.onsetPeriod is not None:
        at = _time(condition.onsetPeriod.start)
    if at is None and condition.encounter is not None:
        encounter = mapper.resolve(condition.encounter.reference)
        if encounter is not None and encounter.resource_type == "Encounter":
            at = encounter.period_end
    return at or _time(condition.recordedDate)


def _condition(mapper: _Mapper, entry: Entry) -> tuple[list[FhirEvent], bool]:
    condition = entry.resource
    at = _condition_time(mapper, condition)
    rule, values, display = mapper.coded(entry, "Condition", condition.code, "code", {})
    if at is None:
        return [], rule is not None
    return _timed_events(mapper, rule, values, display, (at, None, None))


def _condition_glance(mapper: _Mapper, entry: Entry, condition: Any) -> Counted:
    at = _condition_time(mapper, condition)
    times, mapped = _timed_glance(mapper, entry, condition.code, "code", (at, None, None))
    return (times if at is not None else []), mapped


def _procedure_times(procedure: Any) -> Times:
    return _time(procedure.performedDateTime), *_period(procedure.performedPeriod)


def _procedure(mapper: _Mapper, entry: Entry) -> tuple[list[FhirEvent], bool]:
    procedure = entry.resource
    rule, values, display = mapper.coded(entry, "Procedure", procedure.code, "code", {})
    return _timed_events(mapper, rule, values, display, _procedure_times(procedure))


def _procedure_glance(mapper: _Mapper, entry: Entry, procedure: Any) -> Counted:
    return _timed_glance(mapper, entry, procedure.code, "code", _procedure_times(procedure))


def _medication_concept(mapper: _Mapper, resource: Any) -> Any:
    """The medication's CodeableConcept: inline, or the referenced Medication's code (a bundle
    entry or a contained resource)."""
    if resource.medicationCodeableConcept is not None:
        return resource.medicationCodeableConcept
    reference = resource.medicationReference
    if reference is None or not reference.reference:
        return None
    if reference.reference.startswith("#"):
        wanted = reference.reference[1:]
        contained = next((c for c in resource.contained or [] if c.id == wanted), None)
        return getattr(contained, "code", None)
    target = mapper.resolve(reference.reference)
    if target is None or target.resource_type != "Medication" or target.resource is None:
        return None
    return target.resource.code


def _administration_times(admin: Any) -> Times:
    return _time(admin.effectiveDateTime), *_period(admin.effectivePeriod)


def _medication_administration(mapper: _Mapper, entry: Entry) -> tuple[list[FhirEvent], bool]:
    admin = entry.resource
    status_reason = _first_code(admin.statusReason[0]) if admin.statusReason else None
    slots = {"status": admin.status or UNKNOWN, "status_reason": status_reason or UNKNOWN}
    concept = _medication_concept(mapper, admin)
    rule, values, display = mapper.coded(
        entry, "MedicationAdministration", concept, "medicationCodeableConcept", slots
    )
    dosage = admin.dosage
    value_of = {
        "rate": (_number(dosage.rateQuantity.value), _quantity_unit(dosage.rateQuantity))
        if dosage is not None and dosage.rateQuantity is not None
        else (None, None),
        "dose": (_number(dosage.dose.value), _quantity_unit(dosage.dose))
        if dosage is not None and dosage.dose is not None
        else (None, None),
    }
    times = _administration_times(admin)
    return _timed_events(mapper, rule, values, display, times, value_of)


def _request_times(request: Any) -> Times:
    validity = request.dispenseRequest.validityPeriod if request.dispenseRequest else None
    start, end = _period(validity)
    at = _time(request.authoredOn)
    return start or at, start or at, end


def _medication_request(mapper: _Mapper, entry: Entry) -> tuple[list[FhirEvent], bool]:
    request = entry.resource
    concept = _medication_concept(mapper, request)
    rule, values, display = mapper.coded(
        entry, "MedicationRequest", concept, "medicationCodeableConcept", {}
    )
    return _timed_events(mapper, rule, values, display, _request_times(request))


def _medication_glance(times_of: Any) -> Any:
    """The first pass of a medication resource: a referenced Medication (not in the first
    pass) makes it one to read (None)."""

    def glance(mapper: _Mapper, entry: Entry, resource: Any) -> Counted | None:
        concept = resource.medicationCodeableConcept
        if concept is None and resource.medicationReference is not None:
            return None
        field = "medicationCodeableConcept"
        return _timed_glance(mapper, entry, concept, field, times_of(resource))

    return glance


def _encounter_class(encounter: Any) -> str:
    return (encounter.class_fhir.code if encounter.class_fhir else None) or UNKNOWN


def _encounter(mapper: _Mapper, entry: Entry) -> tuple[list[FhirEvent], bool]:
    encounter = entry.resource
    start, end = _period(encounter.period)
    hospitalization = encounter.hospitalization
    location = None
    if encounter.location:
        place = encounter.location[0].location
        target = mapper.resolve(place.reference)
        if target is not None and target.resource_type == "Location" and target.resource:
            location = place.display or target.resource.name
        else:
            location = place.display
    slots = {
        "location": location or UNKNOWN,
        "type": (_first_code(encounter.type[0]) if encounter.type else None) or UNKNOWN,
        "admit_source": (_first_code(hospitalization.admitSource) if hospitalization else None)
        or UNKNOWN,
        "discharge_disposition": (
            _first_code(hospitalization.dischargeDisposition) if hospitalization else None
        )
        or UNKNOWN,
    }
    concept = encounter.type[0] if encounter.type else None
    rule, values, display = mapper.coded(
        entry, "Encounter", concept, "type", slots, _encounter_class(encounter)
    )
    if rule is None:
        values["code"] = _encounter_class(encounter)
        values["system"] = _system_name(encounter.class_fhir.system)
        display = encounter.class_fhir.display or display
    return _timed_events(mapper, rule, values, display, (None, start, end))


def _encounter_glance(mapper: _Mapper, entry: Entry, encounter: Any) -> Counted:
    concept = encounter.type[0] if encounter.type else None
    times = (None, *_period(encounter.period))
    return _timed_glance(mapper, entry, concept, "type", times, _encounter_class(encounter))


def _patient(mapper: _Mapper, entry: Entry) -> tuple[list[FhirEvent], bool]:
    patient = entry.resource
    codes = mapper.mapping.patient
    events = []
    birth = _time(patient.birthDate)
    if birth is not None:
        events.append(FhirEvent(birth, codes.birth))
    if patient.gender:
        gender = codes.genders.get(patient.gender, patient.gender)
        events.append(FhirEvent(None, codes.gender.format_map({"gender": gender})))
    return events, True


_READERS = {
    "Patient": _patient,
    "Observation": _observation,
    "Condition": _condition,
    "Procedure": _procedure,
    "MedicationAdministration": _medication_administration,
    "MedicationRequest": _medication_request,
    "Encounter": _encounter,
}
assert set(_READERS) == {"Patient", *MAPPED_TYPES}
_GLANCERS = {
    "Observation": _observation_glance,
    "Condition": _condition_glance,
    "Procedure": _procedure_glance,
    "MedicationAdministration": _medication_glance(_administration_times),
    "MedicationRequest": _medication_glance(_request_times),
    "Encounter": _encounter_glance,
}
"""The first pass's counterpart of each reader but the Patient's (always read): the events'
times and whether a rule maps it, from `medtpe_core.fhir.glance`'s fields; None: read it."""
READ_TYPES = frozenset({*_READERS, "Medication", "Location"})
"""Resource types parsed (validated as R4): those mapped and those they reference."""
_KEPT_MODELS = frozenset({"Patient", "Encounter", "Medication", "Location"})
"""Types whose validated model a cache keeps: other resources' readings look into them."""


def _status(resource: Any) -> str | None:
    status = getattr(resource, "status", None)
    verification = getattr(resource, "verificationStatus", None)
    return _first_code(verification) if verification is not None else status


class ResourceCache:
    """What each resource given as JSON text gave under one site mapping, kept under the BLAKE2b
    digest of that exact text (128 bits: an equal digest is the same resource), for
    `meds_from_fhir`. Bounded in bytes: the least recently used go first while the estimated
    bytes kept (`nbytes`: each entry's events, texts and kept R4B model, `read_bytes`) exceed
    `max_bytes` (0: keep nothing); an entry larger than the bound is not kept. Safe to share
    between threads.

    Memory: about 1 KB per Observation, 3 to 4 KB per kept Patient or Encounter model (MIMIC-IV
    demo ICU stays); the texts themselves are not kept."""

    def __init__(self, mapping: SiteMapping, max_bytes: int) -> None:
        self.mapping = mapping
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._reads: OrderedDict[bytes, tuple[_Read, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._reads)

    def get_many(self, texts: Sequence[bytes | None]) -> list[_Read | None]:
        """What each text gave (None: not kept, or no text)."""
        keys = [_digest(text) if text is not None else None for text in texts]
        with self._lock:
            found = [self._reads.get(key) if key is not None else None for key in keys]
            for key, kept in zip(keys, found, strict=True):
                if key is not None and kept is not None:
                    self._reads.move_to_end(key)
        return [kept[0] if kept is not None else None for kept in found]

    def put_many(self, reads: Sequence[tuple[bytes, _Read]]) -> None:
        """Keep these, dropping the least recently used beyond the byte bound."""
        if self.max_bytes <= 0:
            return
        sized = [(_digest(text), read, read_bytes(read)) for text, read in reads]
        with self._lock:
            for key, read, size in sized:
                if size > self.max_bytes:
                    continue
                old = self._reads.pop(key, None)
                if old is not None:
                    self.nbytes -= old[1]
                self._reads[key] = (read, size)
                self.nbytes += size
            while self.nbytes > self.max_bytes:
                _, (_, size) = self._reads.popitem(last=False)
                self.nbytes -= size


def _digest(text: bytes) -> bytes:
    return hashlib.blake2b(text, digest_size=16).digest()


_ENTRY_BYTES = 600
"""A cache entry's fixed cost: its key, its slot in the index, the `_Read` and its tuples."""
_EVENT_BYTES = 200
"""An event's fixed cost: its tuple, time and number (its texts are counted apart)."""


def read_bytes(read: _Read) -> int:
    """The estimated bytes a `ResourceCache` entry of `read` keeps alive."""
    size = _ENTRY_BYTES + len(read.events or ()) * _EVENT_BYTES
    for event in read.events or ():
        size += sys.getsizeof(event.code) + (sys.getsizeof(event.text) if event.text else 0)
    for code, description in read.described:
        size += sys.getsizeof(code) + sys.getsizeof(description)
    for name, reference in read.references:
        size += sys.getsizeof(name) + sys.getsizeof(reference)
    return size + (_object_bytes(read.resource) if read.resource is not None else 0)


def _object_bytes(value: object) -> int:
    """`sys.getsizeof` of a validated model and everything it holds (models, lists, texts)."""
    size = sys.getsizeof(value)
    if isinstance(value, list | tuple):
        return size + sum(_object_bytes(item) for item in value)
    fields = getattr(value, "__dict__", None)
    if isinstance(fields, dict):
        size += sys.getsizeof(fields)
        size += sum(_object_bytes(item) for item in fields.values() if item is not None)
    return size


def _cached_items(
    resources: Mapping[str, Any] | Sequence[Mapping[str, Any] | bytes],
    mapping: SiteMapping,
    cache: ResourceCache | None,
) -> tuple[list[Any], bool, list[bytes | None], list[_Read | None]]:
    """The resources' items (`resource_items`), whether they came in a Bundle, their JSON texts
    (None: given as a dict) and what `cache` (of `mapping`) holds of each."""
    if cache is not None and cache.mapping is not mapping:
        raise ValueError("the resource cache holds another site mapping's readings")
    items, in_bundle = resource_items(resources)
    texts = [data if isinstance(data, bytes) else None for _, _, data in items]
    known = cache.get_many(texts) if cache is not None else [None] * len(items)
    return items, in_bundle, texts, known


def meds_from_fhir(
    resources: Mapping[str, Any] | Sequence[Mapping[str, Any] | bytes],
    *,
    mapping: SiteMapping,
    patient_id: str | None = None,
    prediction_time: datetime | None = None,
    cache: ResourceCache | None = None,
) -> FhirRecord:
    """One patient's FHIR R4 resources (a Bundle as a dict, or a sequence of resources, each a
    dict or its JSON text) as MEDS events, by `mapping` (`load_site_mapping()`).

    `patient_id`: the FHIR Patient.id of the record (None: the one Patient in the data, else the
    one patient the resources reference). `prediction_time`: events after it are dropped (None:
    none). A resource of another patient, an Observation without a code or a time, a value we
    cannot render or input that is not FHIR R4 raise `FhirInputError` naming the resource and
    field. `cache` (of this `mapping`): resources given as JSON text that it holds are neither
    validated nor read again, and those read here are added; the record is the same with or
    without it.

    >>> from medtpe_core.fhir import load_site_mapping
    >>> bundle = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": {
    ...     "resourceType": "Patient", "id": "7", "birthDate": "2100-01-01"}}]}
    >>> [e.code for e in meds_from_fhir(bundle, mapping=load_site_mapping()).events]
    ['MEDS_BIRTH']
    """
    items, in_bundle, texts, known = _cached_items(resources, mapping, cache)
    reads = [
        read
        if read is not None and not read.stand_in
        # else: validate it as R4
        else _Read.of(parse_resource(data, index, in_bundle, READ_TYPES))
        for (index, _, data), read in zip(items, known, strict=True)
    ]
    mapper = _Mapper(reads, items, mapping, in_bundle)
    return mapper.record(texts, known, patient_id, prediction_time, cache)
