"""A FHIR record as the mapping gives it: its events (`FhirEvent`), the codes' descriptions,
the counts of what became of each resource type (`MappingCounts`) and the faulty elements left
out (`FhirWarning`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

import numpy as np

from medtpe.core.fhir.parsing import FhirWarning
from medtpe.core.meds.events import MedsEvent, SubjectEvents, datetimes_to_array

STAND_IN = "MEDTPE//NOT_READ"
"""The code of the stand-in events of a resource outside the window (`medtpe.core.fhir.window`):
they hold its events' times and number, and the prompt never shows them."""


@dataclass
class ResourceCounts:
    """What became of the resources of one type."""

    mapped: int = 0
    unmapped: int = 0
    after_prediction_time: int = 0
    skipped: int = 0
    outside_window: int = 0
    """Of the above, those outside the prompt's window (`medtpe.core.fhir.window`): counted by
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
    `medtpe.core.fhir.window` chose one), each before `horizon`. `warnings`: each faulty
    element left out of a resource read (`medtpe.core.fhir.parsing.parse_resource`)."""

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
        (`medtpe.core.prompt.task_prompt.build_prompt`'s `horizon`)."""
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
