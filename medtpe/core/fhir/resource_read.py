"""What one resource gives, whatever record it is in (`ResourceRead`): parsed or only glanced,
read or not yet, as a `ResourceCache` keeps it; which types are parsed, skipped or kept."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fhir.resources.R4B.resource import Resource

from medtpe.core.fhir.parsing import Entry
from medtpe.core.fhir.record import FhirEvent
from medtpe.core.fhir.site_mapping import MAPPED_TYPES
from medtpe.core.fhir.values import fhir_period, status_of

READ_BY_RULES = frozenset({"Patient", *MAPPED_TYPES})
"""Resource types the mapping reads to events (`medtpe.core.fhir.readers.READERS`)."""
SKIPPED_STATUSES = frozenset({"entered-in-error", "cancelled", "not-done", "refuted"})
"""Statuses whose resource is not a fact about the patient: skipped and counted."""


READ_TYPES = frozenset({*READ_BY_RULES, "Medication", "Location"})
"""Resource types parsed (validated as R4): those mapped and those they reference."""


KEPT_MODELS = frozenset({"Patient", "Encounter", "Medication", "Location"})
"""Types whose validated model a cache keeps: other resources' readings look into them."""


@dataclass(slots=True)
class ResourceRead:
    """What one resource gives, whatever record it is in (a `ResourceCache` keeps it under the
    digest of the resource's JSON text). `events` None: not read yet, or read again for each
    record because its reading looked at another resource. `resource`, the validated model, is
    kept while a reading may need it: before the resource is read, when it is read for each
    record, and for the types other resources' readings look into (`KEPT_MODELS`). Never changed
    once made (a cache shares it; `learned` makes another); not `frozen`, whose constructor costs
    4x: the first pass makes two for each resource of a record."""

    resource_type: str
    resource_id: str | None
    resource: Resource | None
    references: tuple[tuple[str, str], ...]  # (field, reference) that may name its patient
    skipped: bool
    key: str | None  # `Type/id`, how references name it
    events: tuple[FhirEvent, ...] | None = None
    mapped: bool = False
    described: tuple[tuple[str, str], ...] = ()
    period_end: datetime | None = None  # an Encounter's: a Condition without onset is then
    glance: Any = None  # the first pass's fields (`medtpe.core.fhir.glance`), not yet counted
    stand_in: bool = False  # only glanced: `events` are stand-ins (time, `STAND_IN` code)
    dropped: tuple[tuple[str, str], ...] = ()  # faulty elements left out (`Entry.dropped`)

    @classmethod
    def of(cls, entry: Entry) -> ResourceRead:
        """A parsed resource, not yet read."""
        read = cls._new(entry.resource_type, entry.resource_id, entry.resource)
        read.dropped = entry.dropped
        return read

    @classmethod
    def glanced(cls, resource_type: str, resource_id: str | None, glance: Any) -> ResourceRead:
        """A resource of the first pass only (`medtpe.core.fhir.glance`), not yet counted."""
        return cls._new(resource_type, resource_id, glance, glanced=True)

    @classmethod
    def _new(
        cls, resource_type: str, resource_id: str | None, resource: Any, glanced: bool = False
    ) -> ResourceRead:
        references: tuple[tuple[str, str], ...] = ()
        if resource is not None and resource_type != "Patient":
            references = tuple(
                (name, ref.reference)
                for name in ("subject", "patient")
                if (ref := getattr(resource, name, None)) is not None
                and getattr(ref, "reference", None)
            )
        skipped = resource_type not in READ_BY_RULES or status_of(resource) in SKIPPED_STATUSES
        key = f"{resource_type}/{resource_id}" if resource_id else None
        period_end = None
        if resource_type == "Encounter" and resource is not None:
            period_end = fhir_period(resource.period)[1]
        return cls(
            resource_type,
            resource_id,
            None if glanced else resource,
            references,
            skipped,
            key,
            period_end=period_end,
            glance=resource if glanced else None,
            stand_in=glanced,
        )

    def learned(
        self,
        events: Sequence[FhirEvent],
        mapped: bool,
        described: Sequence[tuple[str, str]],
        looked_elsewhere: bool,
    ) -> ResourceRead:
        """This resource once read (or glanced: stand-in events), as a cache keeps it."""
        if looked_elsewhere:
            return self
        resource = self.resource if self.resource_type in KEPT_MODELS else None
        return ResourceRead(
            self.resource_type,
            self.resource_id,
            resource,
            self.references,
            self.skipped,
            self.key,
            tuple(events),
            mapped,
            tuple(described),
            self.period_end,
            None,
            self.stand_in,
            self.dropped,
        )
