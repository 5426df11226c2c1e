"""FHIR datatypes (as the R4B models give them) as plain values: times as naive UTC datetimes,
finite numbers, a CodeableConcept's codings, a code system's short name, a resource's status."""

from __future__ import annotations

import math
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from medtpe.core.meds.events import to_naive_utc

UNKNOWN = "UNK"
"""What a template placeholder becomes when the resource lacks it (the MEDS ETL's own word)."""


def fhir_time(value: object) -> datetime | None:
    """A FHIR date / dateTime / instant as a naive UTC datetime (a date: its midnight)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return to_naive_utc(value)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    return None


def fhir_number(value: object) -> float | None:
    if value is None:
        return None
    number = float(value) if isinstance(value, Decimal | int | float) else math.nan
    return number if math.isfinite(number) else None


def concept_codings(concept: Any) -> list[tuple[str | None, str | None, str | None]]:
    """(system, code, display) of a CodeableConcept; its text alone as a `text` coding."""
    if concept is None:
        return []
    codings = [(c.system, c.code, c.display) for c in concept.coding or [] if c.code]
    if not codings and concept.text:
        codings = [("text", concept.text, concept.text)]
    return codings


def first_code(concept: Any) -> str | None:
    codings = concept_codings(concept)
    return codings[0][1] if codings else None


def fhir_period(period: Any) -> tuple[datetime | None, datetime | None]:
    if period is None:
        return None, None
    return fhir_time(period.start), fhir_time(period.end)


def system_name(system: str | None) -> str:
    """A code system URL's last path segment (`http://loinc.org` → `loinc.org`)."""
    if not system:
        return UNKNOWN
    return system.rstrip("/").rsplit("/", 1)[-1].removeprefix("urn:oid:") or UNKNOWN


def quantity_unit(quantity: Any) -> str | None:
    if quantity is None:
        return None
    return quantity.unit or quantity.code or None


def status_of(resource: Any) -> str | None:
    status = getattr(resource, "status", None)
    verification = getattr(resource, "verificationStatus", None)
    return first_code(verification) if verification is not None else status
