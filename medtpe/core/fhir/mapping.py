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
(`medtpe.core.fhir.parsing`). With a `ResourceCache`, a resource given as JSON text (`bytes`) that
the cache has seen is neither validated nor read again: what it gave is kept under the digest of
its exact text (a CDS hook re-asked about a patient after new observations arrived validates
only those). A resource whose reading looked at another one (a Condition's encounter, a
referenced Medication or Location) keeps its validated model and is read again for each record.

Modules: `record` (the record and its counts), `readers` (each type's reader beside its glance),
`resource_read` (what one resource gives), `resource_cache`, `context` (what the readers share:
references, rules, codes), `mapper` (one record's resources mapped), `values` (FHIR datatypes
as plain values), `parsing` (R4 validation), `glance` (the first pass), `window` (read only as
far as the prompt reaches).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from medtpe.core.fhir.mapper import Mapper
from medtpe.core.fhir.parsing import parse_resource
from medtpe.core.fhir.record import FhirRecord
from medtpe.core.fhir.resource_cache import ResourceCache, cached_items
from medtpe.core.fhir.resource_read import READ_TYPES, ResourceRead
from medtpe.core.fhir.site_mapping import SiteMapping

__all__ = ["READ_TYPES", "meds_from_fhir"]


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

    >>> from medtpe.core.fhir import load_site_mapping
    >>> bundle = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": {
    ...     "resourceType": "Patient", "id": "7", "birthDate": "2100-01-01"}}]}
    >>> [e.code for e in meds_from_fhir(bundle, mapping=load_site_mapping()).events]
    ['MEDS_BIRTH']
    """
    items, in_bundle, texts, known = cached_items(resources, mapping, cache)
    reads = [
        read
        if read is not None and not read.stand_in
        # else: validate it as R4
        else ResourceRead.of(parse_resource(data, index, in_bundle, READ_TYPES))
        for (index, _, data), read in zip(items, known, strict=True)
    ]
    mapper = Mapper(reads, items, mapping, in_bundle)
    return mapper.record(texts, known, patient_id, prediction_time, cache)
