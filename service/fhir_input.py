"""A request's FHIR Bundle as the record's prompt: the site mapping (`medtpe_core.fhir`), read
as far back as the prompt reaches (`inference.fhir_prompt`), with its errors as 422 answers
locating the entry and field."""

from __future__ import annotations

from collections.abc import Sequence

from inference.fhir_prompt import prepare_fhir
from inference.predictor import Predictor, PreparedRecord
from medtpe_core.fhir import FhirInputError, FhirRecord, SiteMapping
from medtpe_core.fhir.window import FhirWindow
from medtpe_core.meds import SubjectEvents
from medtpe_core.tasks import Task
from service.collector import collector_paused
from service.errors import ApiError, field_error
from service.schemas import FhirBundle, FhirMapping, IsoTime, ResourceMapping


def bundle_record(
    mapping: SiteMapping,
    predictor: Predictor,
    task: Task,
    bundle: FhirBundle,
    prediction_time: IsoTime | None,
    loc: Sequence[str | int],
) -> tuple[SubjectEvents, FhirRecord, PreparedRecord]:
    """The events of the Bundle at `loc` (up to `prediction_time`), the mapping's record and the
    prompt `predictor` prepared of it; a 422 naming the entry, resource and field when the
    Bundle cannot be mapped or holds no event of the patient (CPU work: call it in a worker
    thread)."""
    where = [*loc, "bundle"]
    try:
        with collector_paused():
            window = FhirWindow(bundle, mapping=mapping, prediction_time=prediction_time)
            prepared, record = prepare_fhir(predictor, task, window, prediction_time)
    except FhirInputError as exc:
        detail = field_error([*where, *exc.loc], str(exc), "fhir_input")
        raise ApiError(422, "invalid_request", detail) from exc
    if prepared is None or not record.rows:
        detail = field_error(
            [*where, "entry"], "the Bundle holds no event of the patient", "fhir_no_events"
        )
        raise ApiError(422, "invalid_request", detail)
    return record.subject_events(), record, prepared


def fhir_mapping(record: FhirRecord) -> FhirMapping:
    """The response's account of the mapping: subject id and per-type counts."""
    counts = record.counts.as_dict()
    return FhirMapping(
        subject_id=record.subject_id,
        counts={name: ResourceMapping(**values) for name, values in counts.items()},
    )
