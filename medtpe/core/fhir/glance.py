"""The first pass over a record's FHIR resources: a typed decode (msgspec) of only the fields
that decide whose a resource is, when its events fall and how many it gives (its status, its
patient reference, its times, its codings, an Observation's components and which value types it
has), without the R4B models (`medtpe.core.fhir.parsing`, about 0.45 ms a resource).

Times are parsed by `fhir.resources`' own types (the `fhirtypes` dateTime and instant), so a
time reads the same here as in the validated model. A field of the wrong JSON type or a time
that does not parse is a `FhirInputError` naming the field. Everything else of the resource
(other elements, cardinalities, value sets, the `value[x]` contents) is left to the validation
of the resources whose events the prompt can show (`medtpe.core.fhir.window`).

Cost: a few microseconds a resource (times memoised by their text).
"""

from __future__ import annotations

import re
import threading
from typing import Any, ClassVar

import msgspec
from fhir.resources.R4B import fhirtypes
from pydantic import TypeAdapter, ValidationError

from medtpe.core.fhir.parsing import FhirInputError

_DATETIME = TypeAdapter(fhirtypes.DateTimeType)
_INSTANT = TypeAdapter(fhirtypes.InstantType)
_PARSED: dict[tuple[bool, str], object] = {}
_PARSED_MAX = 200_000
_PARSED_LOCK = threading.Lock()


def _parsed(text: object, instant: bool) -> object:
    """A FHIR dateTime (or instant) as `fhir.resources` reads it: a datetime, a date, or the
    text itself for a partial date; ValueError when it is none."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError("a FHIR time is a JSON string")
    key = (instant, text)
    value = _PARSED.get(key)
    if value is None:
        try:
            value = (_INSTANT if instant else _DATETIME).validate_python(text)
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
        with _PARSED_LOCK:
            if len(_PARSED) >= _PARSED_MAX:
                _PARSED.clear()
            _PARSED[key] = value
    return value


class _Timed(msgspec.Struct):
    """A struct whose `_TIMES` fields (dateTime; `_INSTANTS`: instant) are parsed on decode."""

    _TIMES: ClassVar[tuple[str, ...]] = ()
    _INSTANTS: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for name in (*self._TIMES, *self._INSTANTS):
            try:
                setattr(self, name, _parsed(getattr(self, name), name in self._INSTANTS))
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None


class Coding(msgspec.Struct):
    system: str | None = None
    code: str | None = None
    display: str | None = None


class Concept(msgspec.Struct):
    coding: list[Coding] | None = None
    text: str | None = None


class Reference(msgspec.Struct):
    reference: str | None = None


class Period(_Timed):
    _TIMES = ("start", "end")
    start: Any = None
    end: Any = None


class Present(msgspec.Struct):
    """A complex value whose contents the first pass does not read."""


class _Resource(_Timed):
    resourceType: str | None = None
    id: object = None
    status: str | None = None
    subject: Reference | None = None
    patient: Reference | None = None


class _Valued(_Resource):
    """The `value[x]` an Observation (or a component: no resource field of its own) has, by
    type; contents not read."""

    valueQuantity: Present | None = None
    valueCodeableConcept: Present | None = None
    valueRange: Present | None = None
    valueRatio: Present | None = None
    valueSampledData: Present | None = None
    valuePeriod: Present | None = None
    valueInteger: object = None
    valueString: object = None
    valueBoolean: object = None
    valueDateTime: object = None
    valueTime: object = None


class Component(_Valued):
    code: Concept | None = None


class Observation(_Valued):
    _TIMES = ("effectiveDateTime",)
    _INSTANTS = ("effectiveInstant",)
    code: Concept | None = None
    effectiveDateTime: Any = None
    effectiveInstant: Any = None
    effectivePeriod: Period | None = None
    component: list[Component] | None = None


class Condition(_Resource):
    _TIMES = ("onsetDateTime", "recordedDate")
    verificationStatus: Concept | None = None
    code: Concept | None = None
    onsetDateTime: Any = None
    onsetPeriod: Period | None = None
    encounter: Reference | None = None
    recordedDate: Any = None


class Procedure(_Resource):
    _TIMES = ("performedDateTime",)
    code: Concept | None = None
    performedDateTime: Any = None
    performedPeriod: Period | None = None


class MedicationAdministration(_Resource):
    _TIMES = ("effectiveDateTime",)
    medicationCodeableConcept: Concept | None = None
    medicationReference: Reference | None = None
    effectiveDateTime: Any = None
    effectivePeriod: Period | None = None


class DispenseRequest(msgspec.Struct):
    validityPeriod: Period | None = None


class MedicationRequest(_Resource):
    _TIMES = ("authoredOn",)
    medicationCodeableConcept: Concept | None = None
    medicationReference: Reference | None = None
    authoredOn: Any = None
    dispenseRequest: DispenseRequest | None = None


class Encounter(_Resource):
    type: list[Concept] | None = None
    class_fhir: Coding | None = msgspec.field(default=None, name="class")
    period: Period | None = None


GLANCED_TYPES: dict[str, type[_Resource]] = {
    cls.__name__: cls
    for cls in (
        Observation,
        Condition,
        Procedure,
        MedicationAdministration,
        MedicationRequest,
        Encounter,
    )
}
"""The types the first pass reads: those mapped to events, but the Patient (always read)."""
_DECODERS = {name: msgspec.json.Decoder(cls) for name, cls in GLANCED_TYPES.items()}
_AT = re.compile(r"^(?:(\w+): )?(.*?)(?: - at `\$(.*)`)?$", re.DOTALL)


def glance(
    data: object, resource_type: str, resource_id: str | None, index: int, in_bundle: bool
) -> _Resource:
    """The first pass's fields of one resource of a `GLANCED_TYPES` type (its JSON text or
    object); `FhirInputError` naming the field of the wrong JSON type or the time that does not
    parse."""
    try:
        if isinstance(data, bytes):
            return _DECODERS[resource_type].decode(data)
        return msgspec.convert(data, GLANCED_TYPES[resource_type])
    except msgspec.ValidationError as exc:
        found = _AT.match(str(exc))
        assert found is not None  # the pattern matches any text
        name, message, path = found.groups()
        parts = [p for p in re.split(r"[.\[\]]+", path or "") if p]
        field = ".".join([*parts, name] if name else parts) or None
        raise FhirInputError(
            message,
            index=index,
            resource_type=resource_type,
            resource_id=resource_id,
            field=field,
            in_bundle=in_bundle,
        ) from None
