"""The record a prediction is about, built once where it comes in — MEDS events (`/predict`,
`/tokenize`, the batch jobs) or FHIR resources read through the site mapping (`/predict`'s
Bundle, a CDS hook's prefetch, a Bulk Data export) — and prepared into the task's prompt in one
place, whatever door it came through:

    record = MedsRecord(events, prediction_time=None)
    prepared = record.prepare(predictor, task)   # the prompt, its ids under both tokenizers

Preparing is CPU work (rendering, tokenizing, for FHIR the mapping): call it in a worker thread.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from medtpe.core.fhir import ResourceCache, SiteMapping
from medtpe.core.fhir.window import FhirWindow
from medtpe.core.meds import SubjectEvents
from medtpe.core.tasks import Task
from medtpe.inference.collector import collector_paused
from medtpe.inference.predictor import Predictor, PreparedRecord


class NoEventsError(ValueError):
    """The record holds no event of its patient: nothing to predict from."""


@dataclass(frozen=True)
class MedsRecord:
    """A patient's MEDS events, to be read up to `prediction_time` (None: one minute after the
    last event)."""

    events: SubjectEvents
    prediction_time: datetime | None = None

    def prepare(self, predictor: Predictor, task: Task) -> PreparedRecord:
        """The task prompt of the events within `predictor`'s input budget."""
        return self.prepare_all(predictor, [task])[0]

    def prepare_all(self, predictor: Predictor, tasks: Sequence[Task]) -> list[PreparedRecord]:
        """Each task's prompt of the events, the record rendered once (`Predictor.prepare_all`)."""
        return predictor.prepare_all(tasks, self.events, self.prediction_time)


@dataclass(frozen=True)
class FhirResources:
    """A patient's FHIR resources — a Bundle, or resources (objects or their JSON text) — behind
    the site `mapping`, read only as far back as the prompt reaches (`prepare`); `patient_id`
    picks the patient among several, `cache` keeps what resources seen before gave
    (`medtpe.core.fhir.ResourceCache`)."""

    TOKENS_PER_RESOURCE = 8
    """The first window reads `max_input_tokens / TOKENS_PER_RESOURCE` resources (an ICU record's
    event lines take about 8.5 tokens an event at 4,096 and 8,192 tokens, its resources give
    about 1.2 events each)."""
    GROWTH = 1.5
    """Each further window reads this many times as many resources."""

    resources: Mapping[str, Any] | Sequence[Mapping[str, Any] | bytes]
    mapping: SiteMapping
    prediction_time: datetime | None = None
    patient_id: str | None = None
    cache: ResourceCache | None = None

    def prepare(self, predictor: Predictor, task: Task) -> PreparedRecord:
        """The task prompt of the mapped events (`prepare_all` with one task)."""
        return self.prepare_all(predictor, [task])[0]

    def prepare_all(self, predictor: Predictor, tasks: Sequence[Task]) -> list[PreparedRecord]:
        """Each task's prompt of the mapped events, with the mapping's record (`fhir`): the
        newest resources read first (`medtpe.core.fhir.window`), more while a prompt reaches
        back to a resource not read (`Prompt.reaches`), so each prompt is byte-identical to
        that of the whole record read and the counts are the whole record's. A resource the
        mapping cannot read raises its `FhirInputError`, a record without an event of the
        patient `NoEventsError`. The collector is paused meanwhile (`medtpe.core.fhir` makes
        many short-lived objects)."""
        with collector_paused():
            window = FhirWindow(
                self.resources,
                mapping=self.mapping,
                patient_id=self.patient_id,
                prediction_time=self.prediction_time,
                cache=self.cache,
            )
            n: int | None = max(1, predictor.max_input_tokens // self.TOKENS_PER_RESOURCE)
            while True:
                record = window.record(n)
                if not record.rows:
                    raise NoEventsError("the record holds no event of the patient")
                prepared = predictor.prepare_all(
                    tasks,
                    record.subject_events(),
                    self.prediction_time,
                    record.descriptions,
                    record.horizon,
                )
                if not any(p.prompt.reaches(record.horizon) for p in prepared):
                    return [dataclasses.replace(p, fhir=record) for p in prepared]
                assert n is not None  # the whole record read has no horizon
                n = math.ceil(n * self.GROWTH)
                n = None if n >= window.n_candidates else n


PatientRecord = MedsRecord | FhirResources
"""One patient's record, whichever door it came through."""
