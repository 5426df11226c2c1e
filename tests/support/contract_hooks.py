"""schemathesis hooks for the contract test (loaded through `SCHEMATHESIS_HOOKS`): the rules the
schema states in words because JSON Schema cannot (the events of a record share a subject; a time
must stay within the years 1–9999 once converted to UTC; a `bundle` is valid FHIR R4 with events
of one patient) shape the schema-valid cases. Schema-invalid cases stay as generated."""

from __future__ import annotations

import schemathesis
from schemathesis import GenerationMode

SMALL_BUNDLE = {
    "resourceType": "Bundle",
    "entry": [{"resource": {"resourceType": "Patient", "id": "p", "gender": "female"}}],
}
"""What a schema-valid case's `bundle` becomes (FHIR R4 validity is no JSON Schema): one
Patient, small enough for a batch of the most records within the body limit."""

_EDGE_DAYS = ("0001-01-01", "9999-12-31")


def _schema_valid(case: schemathesis.Case) -> bool:
    return case.meta is not None and case.meta.generation.mode == GenerationMode.POSITIVE


@schemathesis.hook
def filter_case(ctx: schemathesis.HookContext, case: schemathesis.Case) -> bool:
    """Leave out schema-valid cases with a time on the first or last day of the calendar: with
    an offset, those may leave the years 1–9999 in UTC (refused with 422, as documented)."""
    return not _schema_valid(case) or not any(day in repr(case.body) for day in _EDGE_DAYS)


@schemathesis.hook
def map_case(ctx: schemathesis.HookContext, case: schemathesis.Case) -> schemathesis.Case:
    """In schema-valid cases, give all events of a record the first event's subject, and make a
    record's `bundle` a one-Patient Bundle (keeping the generated Bundle `type`)."""
    if not _schema_valid(case):
        return case
    body = case.body
    records = body.get("records") if isinstance(body, dict) else None
    for request in records if isinstance(records, list) else [body]:
        if isinstance(request, dict) and isinstance(request.get("bundle"), dict):
            request["bundle"] = {**SMALL_BUNDLE, "type": request["bundle"].get("type")}
        events = request.get("events") if isinstance(request, dict) else None
        if isinstance(events, list) and events and all(isinstance(e, dict) for e in events):
            subject = events[0].get("subject_id")
            for event in events:
                if "subject_id" in event:
                    event["subject_id"] = subject
    return case
