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

The subject id: an integer `Patient.identifier` of a `subject_identifier_systems` system, else an
integer `Patient.id`, else the first 48 bits of the SHA-256 of `Patient.id` (stable, JSON-safe).

Cost: linear in the resources; nearly all of it is `fhir.resources` validation
(`medtpe_core.fhir.parsing`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from medtpe_core.fhir.parsing import Entry, FhirInputError, parse_entries
from medtpe_core.fhir.site_mapping import MAPPED_TYPES, Rule, SiteMapping
from medtpe_core.meds import MAX_SUBJECT_ID, MedsEvent, to_naive_utc

UNKNOWN = "UNK"
"""What a template placeholder becomes when the resource lacks it (the MEDS ETL's own word)."""
SKIPPED_STATUSES = frozenset({"entered-in-error", "cancelled", "not-done", "refuted"})
"""Statuses whose resource is not a fact about the patient: skipped and counted."""
UNRENDERABLE_VALUES = ("valueRange", "valueRatio", "valueSampledData", "valuePeriod")
"""Observation value types with no one-line rendering: an error naming the field."""


@dataclass
class ResourceCounts:
    """What became of the resources of one type."""

    mapped: int = 0
    unmapped: int = 0
    after_prediction_time: int = 0
    skipped: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts as a JSON object."""
        return {
            "mapped": self.mapped,
            "unmapped": self.unmapped,
            "after_prediction_time": self.after_prediction_time,
            "skipped": self.skipped,
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
        """`{resource type: {mapped, unmapped, after_prediction_time, skipped}}`, types sorted."""
        return {name: self.by_type[name].as_dict() for name in sorted(self.by_type)}

    @property
    def n_resources(self) -> int:
        """All resources counted."""
        return sum(sum(c.as_dict().values()) for c in self.by_type.values())


@dataclass(frozen=True)
class FhirRecord:
    """One patient's FHIR resources as MEDS events.

    `descriptions` holds the codes' descriptions the mapping carries (display text of rules
    with `describe` and of unmapped codings); the site's codes metadata takes precedence."""

    subject_id: int
    patient_id: str | None
    events: list[MedsEvent]
    descriptions: dict[str, str]
    counts: MappingCounts


@dataclass(frozen=True)
class _Event:
    time: datetime | None
    code: str
    value: float | None = None
    text: str | None = None


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


def _is_int(text: str | None) -> bool:
    return bool(text) and text.isdigit() and int(text) <= MAX_SUBJECT_ID


class _Slots(dict[str, str]):
    """Template values; a missing one is `UNK` (a rule may name a slot its type lacks)."""

    def __missing__(self, key: str) -> str:
        return UNKNOWN


class _Mapper:
    """One call of `meds_from_fhir`: the bundle's indexes, the events and counts so far."""

    def __init__(self, entries: list[Entry], mapping: SiteMapping, in_bundle: bool) -> None:
        self.entries = entries
        self.mapping = mapping
        self.in_bundle = in_bundle
        self.by_reference: dict[str, Entry] = {}
        for entry in entries:
            if entry.resource_id:
                self.by_reference[f"{entry.resource_type}/{entry.resource_id}"] = entry
            if entry.full_url:
                self.by_reference[entry.full_url] = entry
        self.descriptions: dict[str, str] = {}

    def error(self, entry: Entry, message: str, field: str | None) -> FhirInputError:
        return FhirInputError(
            message,
            index=entry.index,
            resource_type=entry.resource_type,
            resource_id=entry.resource_id,
            field=field,
            in_bundle=self.in_bundle,
        )

    def resolve(self, reference: str | None) -> Entry | None:
        """The entry a reference points to (`Type/id`, an absolute URL ending in it, a fullUrl)."""
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

    def patient_of(self, entry: Entry) -> tuple[str | None, str | None]:
        """(the patient id a resource belongs to, the field that says so); (None, None) when it
        names no patient."""
        resource = entry.resource
        if resource is None:  # a type the mapping does not read
            return None, None
        if entry.resource_type == "Patient":
            return resource.id, "id"
        for name in ("subject", "patient"):
            reference = getattr(resource, name, None)
            if reference is None or not getattr(reference, "reference", None):
                continue
            target = self.resolve(reference.reference)
            if target is not None and target.resource_type == "Patient":
                return target.resource_id, f"{name}.reference"
            parts = reference.reference.split("/_history/")[0].rstrip("/").split("/")
            if len(parts) >= 2 and parts[-2] == "Patient":
                return parts[-1], f"{name}.reference"
        return None, None

    def the_patient(self, patient_id: str | None) -> str | None:
        """The record's patient id: `patient_id`, else the one Patient (or referenced one)."""
        if patient_id is not None:
            return patient_id
        patients = [e.resource_id for e in self.entries if e.resource_type == "Patient"]
        if len(patients) > 1:
            second = [e for e in self.entries if e.resource_type == "Patient"][1]
            raise self.error(second, "more than one Patient: the input holds one record", "id")
        if patients:
            return patients[0]
        referenced = {self.patient_of(e)[0] for e in self.entries} - {None}
        if len(referenced) > 1:
            raise FhirInputError(
                f"resources of {len(referenced)} patients and no Patient resource: give the "
                "patient id"
            )
        return next(iter(referenced), None)

    # --- codes --------------------------------------------------------------------------------

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
        codings = _codings(concept)
        if not codings and encounter_class is None:
            raise self.error(entry, "a code is required", field)
        pairs = [(system, code) for system, code, _ in codings]
        found = self.mapping.rule_for(resource_type, pairs, encounter_class)
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
        from there; a UCUM unit's own brackets are dropped: `mm[Hg]` → `mmHg`)."""
        if display and code not in self.descriptions:
            shown = unit.replace("[", "").replace("]", "") if unit else None
            self.descriptions[code] = f"{display} [{shown}]" if shown else display

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


def _observation_value(
    mapper: _Mapper, entry: Entry, resource: Any, prefix: str = ""
) -> tuple[float | None, str | None, str | None]:
    """(number, text, unit) of an Observation or component value; an error for a value type we
    cannot render."""
    for name in UNRENDERABLE_VALUES:
        if getattr(resource, name, None) is not None:
            raise mapper.error(entry, "a value of this type cannot be rendered", prefix + name)
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


def _observation(mapper: _Mapper, entry: Entry) -> tuple[list[_Event], bool]:
    obs = entry.resource
    time = _time(obs.effectiveDateTime or obs.effectiveInstant)
    if time is None and obs.effectivePeriod is not None:
        time = _time(obs.effectivePeriod.start)
    if time is None:
        raise mapper.error(entry, "an Observation needs a time (effective[x])", "effectiveDateTime")
    parts = [(obs, "")] + [(c, f"component.{i}.") for i, c in enumerate(obs.component or [])]
    events: list[_Event] = []
    mapped = True
    for part, prefix in parts:
        if part is obs and obs.component and not _has_value(obs):
            continue  # a panel: its components are the events
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
        events.append(_Event(time, code, number, text))
    return events, mapped


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


def _timed_events(
    mapper: _Mapper,
    rule: Rule | None,
    values: dict[str, str],
    display: str | None,
    at: datetime | None,
    start: datetime | None,
    end: datetime | None,
    value_of: Mapping[str, tuple[float | None, str | None]] | None = None,
) -> tuple[list[_Event], bool]:
    """Events of a rule: `code` at `at` (else `start`), `start` / `end` templates at the period's
    ends; a coding no rule takes is one unmapped event at `at` / `start`."""
    value_of = value_of or {}
    if rule is None:
        when = at or start
        return ([_Event(when, mapper.unmapped(values, display, None))] if when else []), False
    events = []
    for template, when, value_name in (
        (rule.code, at or start, None),
        (rule.start, start or at, rule.start_value),
        (rule.end, end, rule.end_value),
    ):
        if template is None or when is None:
            continue
        number, unit = value_of.get(value_name or "", (None, None))
        code = mapper.code_of(template, values)
        if rule.describe:
            mapper.describe(code, display, unit)
        events.append(_Event(when, code, number))
    return events, True


def _period(period: Any) -> tuple[datetime | None, datetime | None]:
    if period is None:
        return None, None
    return _time(period.start), _time(period.end)


def _condition(mapper: _Mapper, entry: Entry) -> tuple[list[_Event], bool]:
    condition = entry.resource
    at = _time(condition.onsetDateTime)
    if at is None and condition.onsetPeriod is not None:
        at = _time(condition.onsetPeriod.start)
    if at is None and condition.encounter is not None:
        encounter = mapper.resolve(condition.encounter.reference)
        if encounter is not None and encounter.resource_type == "Encounter":
            at = _period(encounter.resource.period)[1]
    at = at or _time(condition.recordedDate)
    rule, values, display = mapper.coded(entry, "Condition", condition.code, "code", {})
    if at is None:
        return [], rule is not None
    return _timed_events(mapper, rule, values, display, at, None, None)


def _procedure(mapper: _Mapper, entry: Entry) -> tuple[list[_Event], bool]:
    procedure = entry.resource
    start, end = _period(procedure.performedPeriod)
    rule, values, display = mapper.coded(entry, "Procedure", procedure.code, "code", {})
    at = _time(procedure.performedDateTime)
    return _timed_events(mapper, rule, values, display, at, start, end)


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
    return getattr(target.resource, "code", None) if target is not None else None


def _medication_administration(mapper: _Mapper, entry: Entry) -> tuple[list[_Event], bool]:
    admin = entry.resource
    start, end = _period(admin.effectivePeriod)
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
    at = _time(admin.effectiveDateTime)
    return _timed_events(mapper, rule, values, display, at, start, end, value_of)


def _medication_request(mapper: _Mapper, entry: Entry) -> tuple[list[_Event], bool]:
    request = entry.resource
    validity = request.dispenseRequest.validityPeriod if request.dispenseRequest else None
    start, end = _period(validity)
    concept = _medication_concept(mapper, request)
    rule, values, display = mapper.coded(
        entry, "MedicationRequest", concept, "medicationCodeableConcept", {}
    )
    at = _time(request.authoredOn)
    return _timed_events(mapper, rule, values, display, start or at, start or at, end)


def _encounter(mapper: _Mapper, entry: Entry) -> tuple[list[_Event], bool]:
    encounter = entry.resource
    start, end = _period(encounter.period)
    hospitalization = encounter.hospitalization
    location = None
    if encounter.location:
        place = encounter.location[0].location
        target = mapper.resolve(place.reference)
        location = place.display or (getattr(target.resource, "name", None) if target else None)
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
        entry, "Encounter", concept, "type", slots, encounter.class_fhir.code or UNKNOWN
    )
    if rule is None:
        values["code"] = encounter.class_fhir.code or UNKNOWN
        values["system"] = _system_name(encounter.class_fhir.system)
        display = encounter.class_fhir.display or display
    return _timed_events(mapper, rule, values, display, None, start, end)


def _patient(mapper: _Mapper, entry: Entry) -> tuple[list[_Event], bool]:
    patient = entry.resource
    codes = mapper.mapping.patient
    events = []
    birth = _time(patient.birthDate)
    if birth is not None:
        events.append(_Event(birth, codes.birth))
    if patient.gender:
        gender = codes.genders.get(patient.gender, patient.gender)
        events.append(_Event(None, codes.gender.format_map({"gender": gender})))
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
READ_TYPES = frozenset({*_READERS, "Medication", "Location"})
"""Resource types parsed (validated as R4): those mapped and those they reference."""


def _status(resource: Any) -> str | None:
    status = getattr(resource, "status", None)
    verification = getattr(resource, "verificationStatus", None)
    return _first_code(verification) if verification is not None else status


def meds_from_fhir(
    resources: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    mapping: SiteMapping,
    patient_id: str | None = None,
    prediction_time: datetime | None = None,
) -> FhirRecord:
    """One patient's FHIR R4 resources (a Bundle as a dict, or a sequence of resource dicts) as
    MEDS events, by `mapping` (`load_site_mapping()`).

    `patient_id`: the FHIR Patient.id of the record (None: the one Patient in the data, else the
    one patient the resources reference). `prediction_time`: events after it are dropped (None:
    none). A resource of another patient, an Observation without a code or a time, a value we
    cannot render or input that is not FHIR R4 raise `FhirInputError` naming the resource and
    field.

    >>> from medtpe_core.fhir import load_site_mapping
    >>> bundle = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": {
    ...     "resourceType": "Patient", "id": "7", "birthDate": "2100-01-01"}}]}
    >>> [e.code for e in meds_from_fhir(bundle, mapping=load_site_mapping()).events]
    ['MEDS_BIRTH']
    """
    entries, in_bundle = parse_entries(resources, READ_TYPES)
    mapper = _Mapper(entries, mapping, in_bundle)
    patient = mapper.the_patient(patient_id)
    cutoff = to_naive_utc(prediction_time) if prediction_time is not None else None
    counts = MappingCounts()
    subject_id: int | None = None
    kept: list[_Event] = []
    for entry in entries:
        owner, where = mapper.patient_of(entry)
        if owner is not None and patient is not None and owner != patient:
            raise mapper.error(entry, f"belongs to another patient than {patient!r}", where)
        if entry.resource_type == "Patient":
            identifiers = entry.resource.identifier or [] if entry.resource else []
            subject_id = _subject_id(entry.resource_id, identifiers, mapping)
        counted = counts.of(entry.resource_type)
        reader = _READERS.get(entry.resource_type)
        if reader is None or _status(entry.resource) in SKIPPED_STATUSES:
            counted.skipped += 1
            continue
        events, mapped = reader(mapper, entry)
        if not events:
            counted.skipped += 1
            continue
        shown = [e for e in events if cutoff is None or e.time is None or e.time <= cutoff]
        if not shown:
            counted.after_prediction_time += 1
            continue
        if mapped:
            counted.mapped += 1
        else:
            counted.unmapped += 1
        kept.extend(shown)
    if subject_id is None:  # the patient is only referenced
        subject_id = _subject_id(patient, [], mapping)
    events = [
        MedsEvent(
            subject_id=subject_id,
            time=e.time,
            code=e.code,
            numeric_value=e.value,
            text_value=e.text,
        )
        for e in kept
    ]
    return FhirRecord(subject_id, patient, events, mapper.descriptions, counts)
