"""`medtpe outcomes`: each ledger prediction of a task labelled with what happened, by the task's
own labeller (`medtpe.core.meds.labels`), at the task's horizon (`medtpe.monitoring.horizons`), and
its cohort attributes (`medtpe.monitoring.cohort`), from a MEDS dataset or a FHIR export's records.

A prediction's outcome is `known` when its horizon has passed by the data's end (the last event
time in the dataset) and the labeller gives a row at its subject and prediction time, `open` while
the horizon has not passed (or is still to come: an ICU stay not yet closed), `no_label` when it
has passed and the task's definition gives no label there. A join reads only the predictions
whose outcome is not known yet (`medtpe.ledger.outcomes.awaiting_outcome`: none recorded, or
`open`), subject by subject, and commits their outcomes as it goes, `CHUNK` rows a transaction
(`medtpe.ledger.outcomes.record_outcomes`): joining again labels the new predictions and closes
the open ones once the data reach their horizon; a `known` or `no_label` outcome is kept as it
is, nothing is duplicated, and a join stopped midway keeps what it committed."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import meds
import numpy as np

from medtpe.core.fhir import FhirInputError, SiteMapping, meds_from_fhir
from medtpe.core.meds.events import SubjectEvents, to_naive_utc
from medtpe.core.meds.labels import LABEL_FUNCTIONS
from medtpe.core.meds.readers import MedsDataset
from medtpe.core.tasks import Task
from medtpe.ledger.outcomes import CHUNK, OutcomeRow, awaiting_outcome, record_outcomes
from medtpe.ledger.store import Ledger
from medtpe.monitoring.cohort import AttributeMap, attributes_at
from medtpe.monitoring.horizons import horizon_of

NOT_IN_DATA = "not_in_data"
"""A prediction whose subject the data do not hold: no outcome row is written (counted)."""


class SubjectSource(Protocol):
    """Records by the ledger's subject id, and the data's end."""

    name: str
    """What the outcomes were read from (stored as each row's `source`)."""
    data_end: datetime | None
    """The last event time in the data (naive UTC)."""

    def events(self, subject_id: str) -> SubjectEvents | None:
        """The subject's events (None: not in the data)."""


@dataclass(frozen=True)
class RecordsSource:
    """Records held by subject id (MEDS subject ids as text), e.g. a FHIR export's patients."""

    name: str
    records: Mapping[str, SubjectEvents]
    data_end: datetime | None

    def events(self, subject_id: str) -> SubjectEvents | None:
        """The subject's events (None: not in the data)."""
        return self.records.get(subject_id)

    @classmethod
    def of(cls, name: str, records: Iterable[SubjectEvents]) -> RecordsSource:
        """The source of `records` (by `subject_id`), its end the latest event time."""
        held = {str(r.subject_id): r for r in records}
        return cls(name, held, latest_time(held.values()))


class MedsSource:
    """A MEDS dataset's records (the ledger's subject id is the MEDS `subject_id`)."""

    def __init__(self, dataset: MedsDataset, name: str) -> None:
        self.dataset = dataset
        self.name = name
        self.data_end = latest_time(dataset.events(s) for s in dataset.subject_ids)

    def events(self, subject_id: str) -> SubjectEvents | None:
        """The subject's events (None: not in the data, or not a MEDS subject id)."""
        try:
            return self.dataset.events(int(subject_id))
        except (KeyError, ValueError):
            return None


def fhir_records(
    patients: Iterable[tuple[str, Sequence[bytes]]],
    mapping: SiteMapping,
    subjects: Mapping[str, int],
    wanted: set[str],
) -> tuple[list[SubjectEvents], int]:
    """The records of the patients (FHIR id, resources as JSON texts) whose subject id
    (`subjects`: the mapping's, by FHIR id) is `wanted`, mapped as `medtpe predict --fhir` maps
    them (`medtpe.core.fhir.meds_from_fhir`, the site mapping), plus the death the mapping leaves
    out of a prompt (`with_death`); and how many the mapping refused."""
    records, refused = [], 0
    for patient, texts in patients:
        if str(subjects.get(patient)) not in wanted:
            continue
        try:
            record = meds_from_fhir(list(texts), mapping=mapping, patient_id=patient)
        except FhirInputError:
            refused += 1
            continue
        records.append(with_death(record.subject_events(), texts))
    return records, refused


def with_death(events: SubjectEvents, texts: Sequence[bytes]) -> SubjectEvents:
    """`events` with a `MEDS_DEATH` event at the Patient's `deceasedDateTime`: the mapping never
    reads it (a prompt must not show the outcome), the labellers need it. A date without a time
    is taken at its start; no (readable) date of death: `events` as they are."""
    for text in texts:
        if b'"deceasedDateTime"' not in text or b'"Patient"' not in text:
            continue
        resource = json.loads(text)
        if resource.get("resourceType") != "Patient":
            continue
        try:
            died = to_naive_utc(datetime.fromisoformat(str(resource["deceasedDateTime"])))
        except (KeyError, ValueError):
            return events
        return SubjectEvents.from_columns(
            events.subject_id,
            np.append(events.times, np.datetime64(died, "us")),
            [*events.codes, meds.death_code],
            np.append(events.numeric_values, np.nan),
            [*events.text_values, None],
        )
    return events


def latest_time(records: Iterable[SubjectEvents]) -> datetime | None:
    """The latest event time of `records` (None: no timed event)."""
    latest = None
    for record in records:
        timed = record.times[~np.isnat(record.times)]
        if timed.size and (latest is None or timed.max() > latest):
            latest = timed.max()
    return None if latest is None else latest.astype("datetime64[us]").item()


def label_subject(
    task: Task,
    events: SubjectEvents,
    predictions: Sequence[tuple[str, datetime | None]],
    data_end: datetime | None,
    mapping: AttributeMap,
) -> Iterator[OutcomeRow]:
    """The outcome and attributes of each (prediction id, prediction time) of one subject."""
    horizon_end = horizon_of(task.name)
    points = {p.prediction_time: p.label for p in LABEL_FUNCTIONS[task.name](events, task)}
    for prediction_id, when in predictions:
        if when is None:
            yield OutcomeRow(prediction_id, "no_label", None, None, {})
            continue
        known_at = horizon_end(events, when)
        if known_at is None or data_end is None or known_at > data_end:
            status, label = "open", None
        elif when in points:
            status, label = "known", bool(points[when])
        else:
            status, label = "no_label", None
        attributes = attributes_at(events, when, mapping)
        yield OutcomeRow(prediction_id, status, label, known_at, attributes)


@dataclass
class OutcomeCounts:
    """How a join went: predictions joined (those whose outcome was not known yet), by status
    (`known`, `open`, `no_label`, `not_in_data`), the known positives, attribute rows written."""

    predictions: int = 0
    statuses: Counter[str] | None = None
    positives: int = 0
    attributes: int = 0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "predictions": self.predictions,
            "statuses": dict(sorted((self.statuses or Counter()).items())),
            "positives": self.positives,
            "attributes": self.attributes,
        }


def subjects_of(ledger: Ledger, task: str) -> set[str]:
    """The subject ids of the ledger's predictions of `task` whose outcome is not known yet."""
    return {subject for _, subject, _ in awaiting_outcome(ledger, task)}


def join_outcomes(
    ledger: Ledger,
    task: Task,
    source: SubjectSource,
    mapping: AttributeMap | None = None,
    *,
    now: datetime | None = None,
) -> OutcomeCounts:
    """Label each ledger prediction of `task` whose outcome is not known yet from `source` and
    store outcomes and attributes as it goes (see the module docstring); the counts."""
    horizon_of(task.name)  # refuse a task without a horizon before reading anything
    mapping = mapping or AttributeMap()
    counts = OutcomeCounts(statuses=Counter())
    joined_at = now or datetime.now(UTC)
    joined: list[OutcomeRow] = []

    def commit() -> None:
        record_outcomes(
            ledger, joined, source=source.name, data_end=source.data_end, joined_at=joined_at
        )
        joined.clear()

    awaiting = awaiting_outcome(ledger, task.name)
    for subject, group in itertools.groupby(awaiting, key=lambda found: found[1]):
        predictions = [(prediction_id, when) for prediction_id, _, when in group]
        counts.predictions += len(predictions)
        events = source.events(subject)
        if events is None:
            counts.statuses[NOT_IN_DATA] += len(predictions)
            continue
        for one in label_subject(task, events, predictions, source.data_end, mapping):
            counts.statuses[one.status] += 1
            counts.positives += one.label is True
            counts.attributes += len(one.attributes)
            joined.append(one)
        if len(joined) >= CHUNK:
            commit()
    if joined:
        commit()
    return counts
