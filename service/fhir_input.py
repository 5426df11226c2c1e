"""A request's FHIR Bundle as the record's events: the site mapping (`medtpe_core.fhir`) with
its errors as 422 answers locating the entry and field."""

from __future__ import annotations

from collections.abc import Sequence

from medtpe_core.fhir import FhirInputError, FhirRecord, SiteMapping, meds_from_fhir
from medtpe_core.meds import SubjectEvents
from service.errors import ApiError, field_error
from service.schemas import FhirBundle, FhirMapping, IsoTime, ResourceMapping


def bundle_events(
    mapping: SiteMapping,
    bundle: FhirBundle,
    prediction_time: IsoTime | None,
    loc: Sequence[str | int],
) -> tuple[SubjectEvents, FhirRecord]:
    """The events of the Bundle at `loc` (up to `prediction_time`) and the mapping's record; a
    422 naming the entry, resource and field when the Bundle cannot be mapped or holds no event
    of the patient (CPU work: call it in a worker thread)."""
    where = [*loc, "bundle"]
    try:
        record = meds_from_fhir(bundle, mapping=mapping, prediction_time=prediction_time)
    except FhirInputError as exc:
        detail = field_error([*where, *exc.loc], str(exc), "fhir_input")
        raise ApiError(422, "invalid_request", detail) from exc
    if not record.rows:
        detail = field_error(
            [*where, "entry"], "the Bundle holds no event of the patient", "fhir_no_events"
        )
        raise ApiError(422, "invalid_request", detail)
    return record.subject_events(), record


def fhir_mapping(record: FhirRecord) -> FhirMapping:
    """The response's account of the mapping: subject id and per-type counts."""
    counts = record.counts.as_dict()
    return FhirMapping(
        subject_id=record.subject_id,
        counts={name: ResourceMapping(**values) for name, values in counts.items()},
    )
