"""A record's FHIR resources read only as far as its prompt can reach: a budgeted prompt shows
the newest events that fit, so the resources older than that need not be validated as R4 nor
mapped; they are counted.

    window = FhirWindow(resources, mapping=mapping, patient_id=patient)
    record = window.record(n)  # the n newest resources read, the older ones stand-ins
    # a prompt that reaches back to a stand-in (`Prompt.reaches(record.horizon)`,
    # `medtpe.core.prompt.task_prompt.build_prompt`): read more
    record = window.record(2 * n)  # (`medtpe.inference.record.FhirResources.prepare` does this)

Every resource gets the first pass (`medtpe.core.fhir.glance`, a few microseconds): a JSON object
with the `resourceType` of an R4 resource; of the right patient (`subject` / `patient`); its times
parse as FHIR dateTime / instant (fhir.resources' own types); an Observation has a time, a code
on itself and each component, and no value type we cannot render; the others have a code where
their reading needs one. From these fields it is counted exactly as reading it would count it
(mapped, unmapped, after the prediction time, skipped) and its events' times and number are
known: they stand in for its events (`FhirRecord.stand_ins`), so the record's event count, the
prompt's omission line and its first and last times are those of the whole record.

Read as `meds_from_fhir` reads every resource (validated with the R4B models, mapped, its
descriptions taken): the Patient, Medication and Location resources, a medication resource
that references its Medication, and the `n` newest resources by their newest event up to the
prediction time (with every resource as new as the last of them). What the others may hold that
only the R4B validation refuses (an unknown element, a malformed Quantity, a code outside its
value set) is not looked at: such a resource is counted (`outside_window`), its events are older
than anything the prompt shows, and it never changes the answer. A code's description comes
from the first read resource that describes it.

The prompt is byte-identical to that of the whole record whenever it does not reach back to
the record's `horizon` (`medtpe.core.prompt.task_prompt`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from medtpe.core.fhir.glance import GLANCED_TYPES, glance
from medtpe.core.fhir.mapper import Mapper
from medtpe.core.fhir.parsing import FhirInputError, parse_resource, resource_head
from medtpe.core.fhir.record import FhirRecord
from medtpe.core.fhir.resource_cache import ResourceCache, cached_items
from medtpe.core.fhir.resource_read import READ_TYPES, ResourceRead
from medtpe.core.fhir.site_mapping import SiteMapping
from medtpe.core.meds.events import to_naive_utc


def _first_pass(data: object, index: int, in_bundle: bool) -> ResourceRead:
    """A resource as the first pass sees it (the types it does not glance: read)."""
    resource_type, resource_id, _ = resource_head(data, index, in_bundle)
    if resource_type in GLANCED_TYPES:
        try:
            fields = glance(data, resource_type, resource_id, index, in_bundle)
        except FhirInputError:
            pass  # read it: validation leaves out a faulty element or names the fault
        else:
            return ResourceRead.glanced(resource_type, resource_id, fields)
    return ResourceRead.of(parse_resource(data, index, in_bundle, READ_TYPES))


class FhirWindow:
    """One patient's FHIR resources after the first pass (every check above raised as a
    `FhirInputError` naming the resource and field), read on demand newest first."""

    def __init__(
        self,
        resources: Mapping[str, Any] | Sequence[Mapping[str, Any] | bytes],
        *,
        mapping: SiteMapping,
        patient_id: str | None = None,
        prediction_time: datetime | None = None,
        cache: ResourceCache | None = None,
    ) -> None:
        """`resources`, `mapping`, `patient_id`, `prediction_time` and `cache` as in
        `meds_from_fhir` (the cache keeps the first pass's counts too)."""
        self._items, self._in_bundle, self._texts, self._known = cached_items(
            resources, mapping, cache
        )
        self._reads = [
            read if read is not None else _first_pass(data, index, self._in_bundle)
            for (index, _, data), read in zip(self._items, self._known, strict=True)
        ]
        self._mapping, self._cache = mapping, cache
        self._patient_id, self._prediction_time = patient_id, prediction_time
        self._full: dict[int, ResourceRead] = {}
        self._newest = self._by_newest_event()

    def __len__(self) -> int:
        return len(self._items)

    def _by_newest_event(self) -> list[tuple[datetime, int]]:
        """(newest event up to the prediction time, index) of each resource with events, newest
        first: those the first pass counted and those the cache holds read (a re-asked record's
        window counts them, so it reads no older resource than a cold one); those only reading
        can count are read now."""
        cutoff = to_naive_utc(self._prediction_time) if self._prediction_time else None
        mapper = Mapper(self._reads, self._items, self._mapping, self._in_bundle)
        newest = []
        for i, read in enumerate(self._reads):
            if read.skipped or (not read.stand_in and read.events is None):
                continue  # the first pass read it whole: every record maps it
            events = read.events
            if events is None:
                glanced = mapper.glance(i)
                if glanced is None:
                    self._reads[i] = self._read(i)
                    continue
                events, mapped, looked_elsewhere = glanced
                self._reads[i] = read.learned(events, mapped, (), looked_elsewhere)
            times = [e.time for e in events if e.time is not None]
            shown = [t for t in times if cutoff is None or t <= cutoff]
            if shown:
                newest.append((max(shown), i))
        newest.sort(key=lambda pair: (pair[0], -pair[1]), reverse=True)
        return newest

    def _read(self, i: int) -> ResourceRead:
        """The `i`-th resource validated as R4, not yet read (kept for later records)."""
        read = self._full.get(i)
        if read is None:
            index, _, data = self._items[i]
            parsed = parse_resource(data, index, self._in_bundle, READ_TYPES)
            read = self._full[i] = ResourceRead.of(parsed)
        return read

    @property
    def n_candidates(self) -> int:
        """Resources that have events up to the prediction time (read or not)."""
        return len(self._newest)

    def record(self, n_newest: int | None) -> FhirRecord:
        """The record with the `n_newest` newest resources read (None: all), and every resource
        as new as the last of them; the older ones stand-ins (`FhirRecord.stand_ins`)."""
        chosen = len(self._newest) if n_newest is None else min(n_newest, len(self._newest))
        while (
            0 < chosen < len(self._newest)
            and self._newest[chosen][0] == self._newest[chosen - 1][0]
        ):
            chosen += 1
        reads = list(self._reads)
        for _, i in self._newest[:chosen]:
            if reads[i].stand_in:
                reads[i] = self._read(i)
        mapper = Mapper(reads, self._items, self._mapping, self._in_bundle)
        return mapper.record(
            self._texts, self._known, self._patient_id, self._prediction_time, self._cache
        )
