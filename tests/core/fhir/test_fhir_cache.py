"""`medtpe.core.fhir.ResourceCache`: resources given as JSON text are validated and read once per
text; the record is the same with and without the cache, a record that grew reads only its new
resources, a resource whose reading looks at another one is read again for each record, and bad
input is refused with the same error either way."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from medtpe.core.fhir import FhirInputError, ResourceCache, load_site_mapping, meds_from_fhir
from medtpe.core.meds import SubjectEvents
from tests.support.cds_support import ICU_PATIENT, load_bundle

MAPPING = load_site_mapping()


def texts(bundle: dict[str, Any]) -> list[bytes]:
    """The Bundle's resources, each as its JSON text (as a CDS hook's prefetch brings them)."""
    return [msgspec.json.encode(e["resource"]) for e in bundle["entry"]]


def as_tuple(record: Any) -> tuple[Any, ...]:
    """Everything a record holds, comparable."""
    return (
        record.subject_id,
        record.patient_id,
        record.rows,
        record.descriptions,
        record.counts.as_dict(),
    )


def test_the_record_is_the_same_with_and_without_the_cache_and_from_text_or_objects() -> None:
    bundle = load_bundle()
    resources = [e["resource"] for e in bundle["entry"]]
    plain = meds_from_fhir(resources, mapping=MAPPING, patient_id=ICU_PATIENT)
    cache = ResourceCache(MAPPING, 2**24)
    first = meds_from_fhir(texts(bundle), mapping=MAPPING, patient_id=ICU_PATIENT, cache=cache)
    again = meds_from_fhir(texts(bundle), mapping=MAPPING, patient_id=ICU_PATIENT, cache=cache)
    assert as_tuple(first) == as_tuple(again) == as_tuple(plain)
    assert len(cache) == len(resources)
    columns, expected = first.subject_events(), SubjectEvents.from_events(plain.events)
    assert columns.codes == expected.codes and columns.text_values == expected.text_values
    assert columns.times.tolist() == expected.times.tolist()
    assert columns.numeric_values.tobytes() == expected.numeric_values.tobytes()


def test_a_grown_record_reads_only_its_new_resources() -> None:
    bundle = load_bundle()
    cache = ResourceCache(MAPPING, 2**24)
    meds_from_fhir(texts(bundle), mapping=MAPPING, patient_id=ICU_PATIENT, cache=cache)
    grown = copy.deepcopy(bundle)
    newest = max(
        (e for e in grown["entry"] if e["resource"]["resourceType"] == "Observation"),
        key=lambda e: e["resource"]["effectiveDateTime"],
    )
    later = copy.deepcopy(newest)
    later["resource"] |= {"id": "new-observation", "effectiveDateTime": "2150-03-02T23:59:00Z"}
    grown["entry"].append(later)
    n_before = len(cache)
    cached = meds_from_fhir(texts(grown), mapping=MAPPING, patient_id=ICU_PATIENT, cache=cache)
    assert len(cache) == n_before + 1  # only the new Observation was read
    plain = meds_from_fhir(texts(grown), mapping=MAPPING, patient_id=ICU_PATIENT)
    assert as_tuple(cached) == as_tuple(plain)
    assert cached.rows[-1].time is not None and cached.rows[-1].time.day == 2


def _encounter(end: str) -> dict[str, Any]:
    return {
        "resourceType": "Encounter",
        "id": "e1",
        "status": "finished",
        "class": {"code": "IMP"},
        "subject": {"reference": "Patient/p1"},
        "period": {"start": "2150-01-01T00:00:00Z", "end": end},
    }


def test_a_reading_that_looks_at_another_resource_is_done_again_for_each_record() -> None:
    patient = {"resourceType": "Patient", "id": "p1", "birthDate": "2100-01-01"}
    condition = {
        "resourceType": "Condition",
        "id": "c1",
        "code": {"coding": [{"system": "http://hl7.org/fhir/sid/icd-10-cm", "code": "I10"}]},
        "subject": {"reference": "Patient/p1"},
        "encounter": {"reference": "Encounter/e1"},
    }  # no onset: the encounter's end
    cache = ResourceCache(MAPPING, 2**20)
    for end in ("2150-01-05T00:00:00Z", "2150-01-09T00:00:00Z"):
        resources = [msgspec.json.encode(r) for r in (patient, _encounter(end), condition)]
        record = meds_from_fhir(resources, mapping=MAPPING, cache=cache)
        condition_times = [e.time for e in record.rows if e.code != "MEDS_BIRTH"][-1:]
        assert [t.isoformat() for t in condition_times if t] == [end[:-1]]


def test_bad_text_is_refused_naming_the_field_and_nothing_is_kept() -> None:
    observation = {
        "resourceType": "Observation",
        "id": "o1",
        "status": "final",
        "subject": {"reference": "Patient/p1"},
        "effectiveDateTime": "2150-01-01T08:00:00Z",
        "valueQuantity": {"value": "high"},
    }
    cache = ResourceCache(MAPPING, 2**20)
    for resources in ([observation], [msgspec.json.encode(observation)], [b"[1, 2]"]):
        with pytest.raises(FhirInputError) as caught:
            meds_from_fhir(resources, mapping=MAPPING, patient_id="p1", cache=cache)
        assert caught.value.index == 0
    assert len(cache) == 0


def test_a_cache_holds_one_mapping_within_its_bytes() -> None:
    bundle = load_bundle()
    whole = ResourceCache(MAPPING, 2**24)
    meds_from_fhir(texts(bundle), mapping=MAPPING, patient_id=ICU_PATIENT, cache=whole)
    assert len(whole) == len(bundle["entry"])
    bound = whole.nbytes // 3
    cache = ResourceCache(MAPPING, bound)
    meds_from_fhir(texts(bundle), mapping=MAPPING, patient_id=ICU_PATIENT, cache=cache)
    assert 0 < len(cache) < len(bundle["entry"]) and 0 < cache.nbytes <= bound
    with pytest.raises(ValueError, match="another site mapping"):
        meds_from_fhir(texts(bundle), mapping=load_site_mapping(), cache=cache)


def test_long_texts_are_kept_by_digest_and_counted_in_bytes() -> None:
    """A resource's text is never a key (a long note would be kept whole): its digest is; what
    a text gives counts towards the bound, and what alone exceeds it is not kept."""
    note = [{"text": "n" * 200_000}]
    observations = [
        {
            "resourceType": "Observation",
            "id": f"o{i}",
            "status": "final",
            "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}]},
            "subject": {"reference": "Patient/p1"},
            "effectiveDateTime": "2150-01-01T08:00:00Z",
            "note": note,
        }
        for i in range(20)
    ]
    long_value = {**observations[0], "id": "long", "valueString": "v" * 300_000, "note": None}
    resources = [msgspec.json.encode(r) for r in [*observations, long_value]]
    cache = ResourceCache(MAPPING, 64 * 1024)
    record = meds_from_fhir(resources, mapping=MAPPING, patient_id="p1", cache=cache)
    assert len(record.rows) == 21
    assert len(cache) == 20  # the 300 KB value alone is over the bound
    assert cache.nbytes <= 64 * 1024 and cache.nbytes < 20 * 4096
    assert all(len(key) == 16 for key in cache._reads)
