"""Each mapped resource type's reader (its events, by the site mapping's rules) beside its
glance (the same resource counted from the first pass's fields, `medtpe.core.fhir.glance`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from medtpe.core.fhir.context import MappingContext
from medtpe.core.fhir.parsing import Entry
from medtpe.core.fhir.record import FhirEvent
from medtpe.core.fhir.resource_read import READ_BY_RULES
from medtpe.core.fhir.site_mapping import Rule
from medtpe.core.fhir.values import (
    UNKNOWN,
    concept_codings,
    fhir_number,
    fhir_period,
    fhir_time,
    first_code,
    quantity_unit,
    system_name,
)

UNRENDERABLE_VALUES = ("valueRange", "valueRatio", "valueSampledData", "valuePeriod")
"""Observation value types with no one-line rendering: an error naming the field."""


def _check_renderable(mapper: MappingContext, entry: Entry, part: Any, prefix: str) -> None:
    """An error for an Observation (or component) value type we cannot render."""
    for name in UNRENDERABLE_VALUES:
        if getattr(part, name, None) is not None:
            raise mapper.error(entry, "a value of this type cannot be rendered", prefix + name)


def _observation_value(
    mapper: MappingContext, entry: Entry, resource: Any, prefix: str = ""
) -> tuple[float | None, str | None, str | None]:
    """(number, text, unit) of an Observation or component value; an error for a value type we
    cannot render."""
    _check_renderable(mapper, entry, resource, prefix)
    if resource.valueQuantity is not None:
        quantity = resource.valueQuantity
        return fhir_number(quantity.value), None, quantity_unit(quantity)
    if resource.valueInteger is not None:
        return float(resource.valueInteger), None, None
    if resource.valueCodeableConcept is not None:
        concept = resource.valueCodeableConcept
        codings = concept_codings(concept)
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


def _observation_time(mapper: MappingContext, entry: Entry, obs: Any) -> datetime:
    """An Observation's time: `effective[x]` (a period's start); an error without one."""
    time = fhir_time(obs.effectiveDateTime or obs.effectiveInstant)
    if time is None and obs.effectivePeriod is not None:
        time = fhir_time(obs.effectivePeriod.start)
    if time is None:
        raise mapper.error(entry, "an Observation needs a time (effective[x])", "effectiveDateTime")
    return time


def _observation_parts(obs: Any) -> list[tuple[Any, str]]:
    """The parts of an Observation that are events, with their field prefix: itself, then each
    component (a panel without a value of its own: only its components)."""
    parts = [] if obs.component and not _has_value(obs) else [(obs, "")]
    return parts + [(c, f"component.{i}.") for i, c in enumerate(obs.component or [])]


def _observation(mapper: MappingContext, entry: Entry) -> tuple[list[FhirEvent], bool]:
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


def _observation_glance(mapper: MappingContext, entry: Entry, obs: Any) -> Counted:
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
    mapper: MappingContext,
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
    mapper: MappingContext,
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


def _condition_time(mapper: MappingContext, condition: Any) -> datetime | None:
    """`onset[x]`, else its encounter's end, else `recordedDate`."""
    at = fhir_time(condition.onsetDateTime)
    if at is None and condition.onsetPeriod is not None:
        at = fhir_time(condition.onsetPeriod.start)
    if at is None and condition.encounter is not None:
        encounter = mapper.resolve(condition.encounter.reference)
        if encounter is not None and encounter.resource_type == "Encounter":
            at = encounter.period_end
    return at or fhir_time(condition.recordedDate)


def _condition(mapper: MappingContext, entry: Entry) -> tuple[list[FhirEvent], bool]:
    condition = entry.resource
    at = _condition_time(mapper, condition)
    rule, values, display = mapper.coded(entry, "Condition", condition.code, "code", {})
    if at is None:
        return [], rule is not None
    return _timed_events(mapper, rule, values, display, (at, None, None))


def _condition_glance(mapper: MappingContext, entry: Entry, condition: Any) -> Counted:
    at = _condition_time(mapper, condition)
    times, mapped = _timed_glance(mapper, entry, condition.code, "code", (at, None, None))
    return (times if at is not None else []), mapped


def _procedure_times(procedure: Any) -> Times:
    return fhir_time(procedure.performedDateTime), *fhir_period(procedure.performedPeriod)


def _procedure(mapper: MappingContext, entry: Entry) -> tuple[list[FhirEvent], bool]:
    procedure = entry.resource
    rule, values, display = mapper.coded(entry, "Procedure", procedure.code, "code", {})
    return _timed_events(mapper, rule, values, display, _procedure_times(procedure))


def _procedure_glance(mapper: MappingContext, entry: Entry, procedure: Any) -> Counted:
    return _timed_glance(mapper, entry, procedure.code, "code", _procedure_times(procedure))


def _medication_concept(mapper: MappingContext, resource: Any) -> Any:
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
    return fhir_time(admin.effectiveDateTime), *fhir_period(admin.effectivePeriod)


def _medication_administration(
    mapper: MappingContext, entry: Entry
) -> tuple[list[FhirEvent], bool]:
    admin = entry.resource
    status_reason = first_code(admin.statusReason[0]) if admin.statusReason else None
    slots = {"status": admin.status or UNKNOWN, "status_reason": status_reason or UNKNOWN}
    concept = _medication_concept(mapper, admin)
    rule, values, display = mapper.coded(
        entry, "MedicationAdministration", concept, "medicationCodeableConcept", slots
    )
    dosage = admin.dosage
    value_of = {
        "rate": (fhir_number(dosage.rateQuantity.value), quantity_unit(dosage.rateQuantity))
        if dosage is not None and dosage.rateQuantity is not None
        else (None, None),
        "dose": (fhir_number(dosage.dose.value), quantity_unit(dosage.dose))
        if dosage is not None and dosage.dose is not None
        else (None, None),
    }
    times = _administration_times(admin)
    return _timed_events(mapper, rule, values, display, times, value_of)


def _request_times(request: Any) -> Times:
    validity = request.dispenseRequest.validityPeriod if request.dispenseRequest else None
    start, end = fhir_period(validity)
    at = fhir_time(request.authoredOn)
    return start or at, start or at, end


def _medication_request(mapper: MappingContext, entry: Entry) -> tuple[list[FhirEvent], bool]:
    request = entry.resource
    concept = _medication_concept(mapper, request)
    rule, values, display = mapper.coded(
        entry, "MedicationRequest", concept, "medicationCodeableConcept", {}
    )
    return _timed_events(mapper, rule, values, display, _request_times(request))


def _medication_glance(times_of: Any) -> Any:
    """The first pass of a medication resource: a referenced Medication (not in the first
    pass) makes it one to read (None)."""

    def glance(mapper: MappingContext, entry: Entry, resource: Any) -> Counted | None:
        concept = resource.medicationCodeableConcept
        if concept is None and resource.medicationReference is not None:
            return None
        field = "medicationCodeableConcept"
        return _timed_glance(mapper, entry, concept, field, times_of(resource))

    return glance


def _encounter_class(encounter: Any) -> str:
    return (encounter.class_fhir.code if encounter.class_fhir else None) or UNKNOWN


def _encounter(mapper: MappingContext, entry: Entry) -> tuple[list[FhirEvent], bool]:
    encounter = entry.resource
    start, end = fhir_period(encounter.period)
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
        "type": (first_code(encounter.type[0]) if encounter.type else None) or UNKNOWN,
        "admit_source": (first_code(hospitalization.admitSource) if hospitalization else None)
        or UNKNOWN,
        "discharge_disposition": (
            first_code(hospitalization.dischargeDisposition) if hospitalization else None
        )
        or UNKNOWN,
    }
    concept = encounter.type[0] if encounter.type else None
    rule, values, display = mapper.coded(
        entry, "Encounter", concept, "type", slots, _encounter_class(encounter)
    )
    if rule is None:
        values["code"] = _encounter_class(encounter)
        values["system"] = system_name(encounter.class_fhir.system)
        display = encounter.class_fhir.display or display
    return _timed_events(mapper, rule, values, display, (None, start, end))


def _encounter_glance(mapper: MappingContext, entry: Entry, encounter: Any) -> Counted:
    concept = encounter.type[0] if encounter.type else None
    times = (None, *fhir_period(encounter.period))
    return _timed_glance(mapper, entry, concept, "type", times, _encounter_class(encounter))


def _patient(mapper: MappingContext, entry: Entry) -> tuple[list[FhirEvent], bool]:
    patient = entry.resource
    codes = mapper.mapping.patient
    events = []
    birth = fhir_time(patient.birthDate)
    if birth is not None:
        events.append(FhirEvent(birth, codes.birth))
    if patient.gender:
        gender = codes.genders.get(patient.gender, patient.gender)
        events.append(FhirEvent(None, codes.gender.format_map({"gender": gender})))
    return events, True


READERS = {
    "Patient": _patient,
    "Observation": _observation,
    "Condition": _condition,
    "Procedure": _procedure,
    "MedicationAdministration": _medication_administration,
    "MedicationRequest": _medication_request,
    "Encounter": _encounter,
}
assert set(READERS) == READ_BY_RULES


GLANCERS = {
    "Observation": _observation_glance,
    "Condition": _condition_glance,
    "Procedure": _procedure_glance,
    "MedicationAdministration": _medication_glance(_administration_times),
    "MedicationRequest": _medication_glance(_request_times),
    "Encounter": _encounter_glance,
}
"""The first pass's counterpart of each reader but the Patient's (always read): the events'
times and whether a rule maps it, from `medtpe.core.fhir.glance`'s fields; None: read it."""
