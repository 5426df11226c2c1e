"""FHIR R4 input read with `fhir.resources` (R4B models, pydantic v2): a Bundle (searchset,
collection, transaction or batch) or a sequence of resources, each resource validated on its own
so that an error names its place. Resources of the types the caller reads are validated whole;
the others only by their `resourceType` (an R4 type), so a flaw in a resource nothing reads (a
DiagnosticReport's code) does not refuse the record.

A resource may come as a JSON object or as its undecoded JSON text (`bytes`, a CDS hook's
prefetch read without decoding it: `ResourceCache` keys on that text).

Cost: pydantic validation of each resource, about 0.3-0.7 ms for an Observation on this machine
(docs/benchmarks.md, "FHIR mapping").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec
from fhir.resources.R4B import get_fhir_model_class
from fhir.resources.R4B.resource import Resource
from pydantic import ValidationError

BUNDLE_TYPES = frozenset({"searchset", "collection", "transaction", "batch"})
"""Bundle types that carry one patient's record (a search result or a set of resources)."""


def _located(
    message: str,
    index: int | None,
    resource_type: str | None,
    resource_id: str | None,
    field: str | None,
    in_bundle: bool,
) -> tuple[str, list[str | int]]:
    """(`message` prefixed with where it is, its `loc` in the input)."""
    where = []
    if index is not None:
        where.append(f"entry {index}" if in_bundle else f"resource {index}")
    if resource_type:
        where.append(f"{resource_type}/{resource_id}" if resource_id else resource_type)
    if field:
        where.append(field)
    loc: list[str | int] = []
    if index is not None:
        loc = ["entry", index, "resource"] if in_bundle else [index]
    if field:
        loc.extend(int(p) if p.isascii() and p.isdigit() else p for p in field.split("."))
    return (f"{', '.join(where)}: {message}" if where else message), loc


class FhirInputError(ValueError):
    """FHIR input we cannot map: not FHIR R4, another patient's resource, an Observation without
    a code or a time, a value we cannot render. Names the resource and the field.

    `loc` locates the field in the input: `["entry", 3, "resource", "code"]` in a Bundle,
    `[3, "code"]` in a list of resources."""

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        resource_type: str | None = None,
        resource_id: str | None = None,
        field: str | None = None,
        in_bundle: bool = True,
    ) -> None:
        self.index = index
        self.resource_type = resource_type
        self.resource_id = resource_id
        self.field = field
        text, self.loc = _located(message, index, resource_type, resource_id, field, in_bundle)
        super().__init__(text)
        self.message = message


@dataclass(frozen=True)
class FhirWarning:
    """An element of a resource left out for a fault of its own (`parse_resource`): `text`
    names the resource, the field and the fault; `loc` locates it as `FhirInputError.loc`."""

    text: str
    loc: tuple[str | int, ...]


PROTECTED_ELEMENTS = frozenset(
    {"resourceType", "id", "subject", "patient", "status", "verificationStatus"}
)
"""Top-level elements whose fault refuses the resource (whose it is, whether it is a fact):
leaving them out would change what the resource says, not only drop a detail."""


@dataclass(frozen=True)
class Entry:
    """One resource of the input: its place, its Bundle `fullUrl`, type and id, the parsed
    model (None for a type the caller does not read) and the faulty elements left out of it
    (`field`, fault)."""

    index: int
    full_url: str | None
    resource_type: str
    resource_id: str | None
    resource: Resource | None
    dropped: tuple[tuple[str, str], ...] = ()


Item = tuple[int, str | None, object]
"""One resource of the input before parsing: its place, its Bundle `fullUrl`, and its data (a
JSON object, or the object's JSON text as `bytes`)."""


class _Head(msgspec.Struct):
    """What is read of a resource's JSON text before its model: its type and id."""

    resourceType: object = None
    id: object = None


_HEAD = msgspec.json.Decoder(_Head)


def _field(loc: Sequence[str | int]) -> str:
    return ".".join(str(p) for p in loc)


def _head(data: object) -> tuple[object, object] | None:
    """(resourceType, id) of a resource's JSON object or text; None when it is no JSON object."""
    if isinstance(data, bytes):
        try:
            head = _HEAD.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        return head.resourceType, head.id
    if isinstance(data, Mapping):
        return data.get("resourceType"), data.get("id")
    return None


def resource_head(data: object, index: int, in_bundle: bool) -> tuple[str, str | None, type]:
    """A resource's (JSON object or text) type, id and R4B model class; `FhirInputError` when it
    is no JSON object with the `resourceType` of an R4 resource."""
    head = _head(data)
    if head is None or not isinstance(head[0], str):
        raise FhirInputError(
            "a FHIR resource is a JSON object with a `resourceType`",
            index=index,
            field="resourceType",
            in_bundle=in_bundle,
        )
    resource_type = head[0]
    resource_id = head[1] if isinstance(head[1], str) else None
    try:
        model = get_fhir_model_class(resource_type)
    except (KeyError, ValueError) as exc:
        raise FhirInputError(
            f"{resource_type!r} is not a FHIR R4 resource type",
            index=index,
            resource_type=resource_type,
            resource_id=resource_id,
            field="resourceType",
            in_bundle=in_bundle,
        ) from exc
    return resource_type, resource_id, model


def parse_resource(
    data: object, index: int, in_bundle: bool, read: Collection[str] | None = None
) -> Entry:
    """One resource (a JSON object, or its JSON text) as an entry, its R4B model validated when
    its type is in `read` (None: every type). An element whose own value is faulty (a blank
    unit code, a number that does not parse; not one of `PROTECTED_ELEMENTS`) is left out and
    named in `Entry.dropped`; any other fault (an unknown element, a required one missing) is a
    `FhirInputError` naming the field."""
    resource_type, resource_id, model = resource_head(data, index, in_bundle)
    if read is not None and resource_type not in read:
        return Entry(index, None, resource_type, resource_id, None)
    try:
        if isinstance(data, bytes):
            return Entry(index, None, resource_type, resource_id, model.model_validate_json(data))
        return Entry(index, None, resource_type, resource_id, model.model_validate(data))
    except ValidationError as exc:
        error = exc.errors()[0]
        repaired = _without_faulty_elements(data, exc)
    if repaired is not None:
        kept, dropped = repaired
        try:
            resource = model.model_validate(kept)
        except ValidationError as again:
            error = again.errors()[0]
        else:
            return Entry(index, None, resource_type, resource_id, resource, dropped)
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "not a FHIR R4 element of this resource"
    elif error["type"] == "missing":
        message = "required by FHIR R4"
    raise FhirInputError(
        message,
        index=index,
        resource_type=resource_type,
        resource_id=resource_id,
        field=_field(error["loc"]) or None,
        in_bundle=in_bundle,
    )


_MAX_DROPPED = 64
"""Faulty elements left out of one resource at most; more refuse it."""


def _without_faulty_elements(
    data: object, exc: ValidationError
) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]] | None:
    """A copy of the resource without the elements whose own value `exc` faults, and (field,
    fault) of each; None when a fault is not of one element's value (an unknown or missing
    element, a protected one, a list item, more than `_MAX_DROPPED`)."""
    errors = exc.errors()
    if len(errors) > _MAX_DROPPED:
        return None
    try:
        copy = msgspec.json.decode(data) if isinstance(data, bytes) else msgspec.to_builtins(data)
    except (msgspec.DecodeError, TypeError):
        return None
    dropped = []
    for error in errors:
        loc = error["loc"]
        if (
            error["type"] in ("extra_forbidden", "missing")
            or not loc
            or loc[0] in PROTECTED_ELEMENTS
            or not isinstance(loc[-1], str)
        ):
            return None
        parent: Any = copy
        for part in loc[:-1]:
            try:
                parent = parent[part]
            except (KeyError, IndexError, TypeError):
                return None
        if not isinstance(parent, dict):
            return None
        if parent.pop(loc[-1], None) is not None:
            dropped.append((_field(loc), error["msg"].removeprefix("Value error, ")))
    return (copy, tuple(dropped)) if dropped and isinstance(copy, dict) else None


def warning_of(
    entry_index: int,
    resource_type: str,
    resource_id: str | None,
    dropped: tuple[str, str],
    in_bundle: bool,
) -> FhirWarning:
    """The warning of one element left out of a resource (`Entry.dropped`)."""
    field, fault = dropped
    text, loc = _located(
        f"left out: {fault}", entry_index, resource_type, resource_id, field, in_bundle
    )
    return FhirWarning(text, tuple(loc))


def resource_items(
    data: Mapping[str, Any] | Sequence[object],
) -> tuple[list[Item], bool]:
    """The resources of a Bundle (entries without a resource, e.g. a transaction's DELETE, are
    left out) or of a sequence of resources (JSON objects or their JSON text), not yet parsed;
    and whether the input was a Bundle."""
    if isinstance(data, Mapping) and data.get("resourceType") == "Bundle":
        bundle_type = data.get("type")
        if not isinstance(bundle_type, str) or bundle_type not in BUNDLE_TYPES:
            raise FhirInputError(
                f"a Bundle of type {bundle_type!r} does not hold a record; expected one of "
                f"{', '.join(sorted(BUNDLE_TYPES))}",
                resource_type="Bundle",
                field="type",
            )
        entries = data.get("entry") or []
        if not isinstance(entries, list):
            raise FhirInputError("a list of entries is expected", field="entry")
        out: list[Item] = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                raise FhirInputError("an entry is a JSON object", field=f"entry.{i}")
            if entry.get("resource") is None:
                continue
            full_url = entry.get("fullUrl")
            out.append((i, full_url if isinstance(full_url, str) else None, entry["resource"]))
        return out, True
    if isinstance(data, Mapping):
        raise FhirInputError(
            "expected a FHIR Bundle or a list of resources",
            resource_type=str(data.get("resourceType") or "") or None,
            field="resourceType",
        )
    return [(i, None, item) for i, item in enumerate(data)], False


def parse_entries(
    data: Mapping[str, Any] | Sequence[object], read: Collection[str] | None = None
) -> tuple[list[Entry], bool]:
    """The resources of `resource_items`, those of the types in `read` parsed (None: all); and
    whether the input was a Bundle."""
    items, in_bundle = resource_items(data)
    entries = [
        replace(parse_resource(resource, i, in_bundle, read), full_url=full_url)
        for i, full_url, resource in items
    ]
    return entries, in_bundle
