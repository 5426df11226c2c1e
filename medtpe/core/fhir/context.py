"""`MappingContext`: what the readers of one record's resources share (`medtpe.core.fhir.readers`):
the resources by reference, the site mapping's rules by coding, the codes' templates and
descriptions, and errors located in the input."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from medtpe.core.fhir.parsing import Entry, FhirInputError, Item
from medtpe.core.fhir.resource_read import ResourceRead
from medtpe.core.fhir.site_mapping import Rule, SiteMapping
from medtpe.core.fhir.values import UNKNOWN, concept_codings, system_name


class _Slots(dict[str, str]):
    """Template values; a missing one is `UNK` (a rule may name a slot its type lacks)."""

    def __missing__(self, key: str) -> str:
        return UNKNOWN


class MappingContext:
    """The input's resources, their index by reference and the codes of the reading under way."""

    def __init__(
        self, reads: list[ResourceRead], items: list[Item], mapping: SiteMapping, in_bundle: bool
    ) -> None:
        self.reads = reads
        self.items = items
        self.mapping = mapping
        self.in_bundle = in_bundle
        self._by_reference: dict[str, ResourceRead] | None = None
        self.looked_elsewhere = False  # the reading under way resolved a reference
        self.described: list[tuple[str, str]] = []  # the reading under way's descriptions
        self._rules: dict[tuple[str, tuple[str | None, ...], str | None], Any] = {}
        """`SiteMapping.rule_for` by (type, code systems, class): a rule takes a coding by its
        system, and a record repeats a few systems thousands of times."""

    def entry(self, i: int) -> Entry:
        """The `i`-th resource as an entry (its place in the input, its model)."""
        read, (index, full_url, _) = self.reads[i], self.items[i]
        resource = read.resource
        return Entry(index, full_url, read.resource_type, read.resource_id, resource, read.dropped)

    def error(self, entry: Entry, message: str, field: str | None) -> FhirInputError:
        """The error of a resource the mapping cannot read, naming the faulty element it needs
        when that was left out (`Entry.dropped`)."""
        fault = dict(entry.dropped).get(field or "")
        return FhirInputError(
            f"{message} ({field} left out: {fault})" if fault else message,
            index=entry.index,
            resource_type=entry.resource_type,
            resource_id=entry.resource_id,
            field=field,
            in_bundle=self.in_bundle,
        )

    @property
    def by_reference(self) -> dict[str, ResourceRead]:
        """The resources by `Type/id` and by `fullUrl` (built on first use)."""
        if self._by_reference is None:
            if any(full_url for _, full_url, _ in self.items):
                index: dict[str, ResourceRead] = {}
                for read, (_, full_url, _) in zip(self.reads, self.items, strict=True):
                    if read.key:
                        index[read.key] = read
                    if full_url:
                        index[full_url] = read
            else:  # a list of resources (a hook's prefetch): one pass in C
                index = {read.key: read for read in self.reads if read.key}
            self._by_reference = index
        return self._by_reference

    def resolve(self, reference: str | None) -> ResourceRead | None:
        """The resource a reference points to (`Type/id`, an absolute URL ending in it, a
        fullUrl)."""
        self.looked_elsewhere = True
        if not reference:
            return None
        found = self.by_reference.get(reference)
        if found is None and "/_history/" in reference:
            found = self.by_reference.get(reference.split("/_history/")[0])
        if found is None:
            parts = reference.rstrip("/").split("/")
            if len(parts) >= 2:
                found = self.by_reference.get(f"{parts[-2]}/{parts[-1]}")
        return found

    # --- codes --------------------------------------------------------------------------------

    def rule(
        self,
        entry: Entry,
        resource_type: str,
        concept: Any,
        field: str,
        encounter_class: str | None = None,
    ) -> tuple[tuple[Rule, int] | None, list[tuple[str | None, str | None, str | None]]]:
        """(the rule that takes the concept and the index of the coding it took, or None; the
        concept's codings); an error when it has no code (and no Encounter class)."""
        codings = concept_codings(concept)
        if not codings and encounter_class is None:
            raise self.error(entry, "a code is required", field)
        key = (resource_type, tuple(system for system, _, _ in codings), encounter_class)
        if key not in self._rules:
            pairs = [(system, code) for system, code, _ in codings]
            self._rules[key] = self.mapping.rule_for(resource_type, pairs, encounter_class)
        return self._rules[key], codings

    def coded(
        self,
        entry: Entry,
        resource_type: str,
        concept: Any,
        field: str,
        slots: Mapping[str, str],
        encounter_class: str | None = None,
    ) -> tuple[Rule | None, dict[str, str], str | None]:
        """(the rule that takes the concept or None, the template slots, the display)."""
        found, codings = self.rule(entry, resource_type, concept, field, encounter_class)
        system, code, display = codings[0] if codings else (None, None, None)
        if found is not None and found[1] >= 0:
            system, code, display = codings[found[1]]
        values = {**slots, "code": code or UNKNOWN, "system": system_name(system)}
        values["display"] = display or code or UNKNOWN
        values["resource_type"] = resource_type.upper()
        return (found[0] if found else None), values, display

    def code_of(self, template: str, values: Mapping[str, str]) -> str:
        """The template filled in; a placeholder this resource has no value for is `UNK`."""
        return template.format_map(_Slots(values))

    def describe(self, code: str, display: str | None, unit: str | None) -> None:
        """The code's description: the display, with the unit in brackets (the renderer reads it
        from there; a UCUM unit's own brackets are dropped: `mm[Hg]` → `mmHg`). The first
        resource to describe a code sets it."""
        if display:
            shown = unit.replace("[", "").replace("]", "") if unit else None
            self.described.append((code, f"{display} [{shown}]" if shown else display))

    def unmapped(self, values: Mapping[str, str], display: str | None, unit: str | None) -> str:
        code = self.code_of(self.mapping.unmapped, values)
        if unit:
            code = f"{code}//{unit}"
        self.describe(code, display, unit)
        return code
