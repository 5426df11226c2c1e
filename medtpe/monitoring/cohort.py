"""A prediction's cohort attributes, read from the subject's record at the prediction time: sex
(the record's `GENDER//…` code), age band (from `MEDS_BIRTH`), and each attribute a site maps
from codes in a small YAML file (`load_attribute_map`):

    # attribute: {code: value}; a code ending in `*` matches every code that starts with the rest
    admission_type:
      "HOSPITAL_ADMISSION//EW EMER.*": emergency
      "HOSPITAL_ADMISSION//ELECTIVE*": elective
    insurance:
      "INSURANCE//Medicare": Medicare

An attribute's value is that of the latest matching event at or before the prediction time
(events without a time, such as sex, count as before it); none matches: the attribute is left
out of that prediction's row."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import meds
import numpy as np
import yaml

from medtpe.core.meds.events import SubjectEvents

SEX_CODES = {"GENDER//F": "female", "GENDER//M": "male"}
"""The MIMIC-IV MEDS codes of sex (the FHIR mapping writes `Patient.gender` as the same codes)."""
AGE_BANDS = ((0, "<18"), (18, "18-44"), (45, "45-64"), (65, "65-79"), (80, "80+"))
"""(lowest age in years, band) in ascending order."""
MAX_MAP_BYTES = 1 << 20
MAX_NAME = 100
MAX_VALUE = 200
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]*$")


class AttributeMapError(ValueError):
    """An attribute map file that is not `{attribute: {code: value}}`."""


@dataclass(frozen=True)
class AttributeMap:
    """Each attribute's codes: exact codes and code prefixes (a trailing `*`), with values."""

    exact: dict[str, dict[str, str]] = field(default_factory=dict)
    prefixes: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """The attributes mapped, sorted."""
        return sorted(set(self.exact) | set(self.prefixes))

    def value(self, name: str, code: str) -> str | None:
        """The value `code` gives attribute `name` (None: the code does not map)."""
        found = self.exact.get(name, {}).get(code)
        if found is not None:
            return found
        return next((v for p, v in self.prefixes.get(name, ()) if code.startswith(p)), None)


def parse_attribute_map(data: object, where: str = "attribute map") -> AttributeMap:
    """An `AttributeMap` from the YAML's data; `AttributeMapError` naming what is wrong."""
    if data is None:
        return AttributeMap()
    if not isinstance(data, Mapping):
        raise AttributeMapError(f"{where}: expected a mapping of attribute names to code maps")
    exact: dict[str, dict[str, str]] = {}
    prefixes: dict[str, tuple[tuple[str, str], ...]] = {}
    for name, codes in data.items():
        if not isinstance(name, str) or not _NAME.match(name) or len(name) > MAX_NAME:
            raise AttributeMapError(f"{where}: attribute name {name!r} is not a plain name")
        if name == "age_band":
            raise AttributeMapError(f"{where}: `age_band` is computed from the birth date")
        if not isinstance(codes, Mapping) or not codes:
            raise AttributeMapError(f"{where}: {name}: expected a mapping of codes to values")
        for code, value in codes.items():
            if not isinstance(code, str) or not code or code == "*":
                raise AttributeMapError(f"{where}: {name}: code {code!r} is not a code")
            if not isinstance(value, str | int | bool) or len(str(value)) > MAX_VALUE:
                raise AttributeMapError(f"{where}: {name}.{code}: value {value!r} is not text")
            if code.endswith("*"):
                prefixes[name] = (*prefixes.get(name, ()), (code[:-1], str(value)))
            else:
                exact.setdefault(name, {})[code] = str(value)
    return AttributeMap(exact, prefixes)


def load_attribute_map(path: Path | None) -> AttributeMap:
    """The attribute map in the YAML file `path` (None: no mapped attribute)."""
    if path is None:
        return AttributeMap()
    if path.stat().st_size > MAX_MAP_BYTES:
        raise AttributeMapError(f"{path}: larger than {MAX_MAP_BYTES} bytes")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise AttributeMapError(f"{path}: not YAML: {exc}") from exc
    return parse_attribute_map(data, str(path))


def age_band(birth: datetime, when: datetime) -> str:
    """The age band of someone born at `birth` on `when`."""
    age = when.year - birth.year - ((when.month, when.day) < (birth.month, birth.day))
    return next(band for lowest, band in reversed(AGE_BANDS) if age >= lowest)


def attributes_at(
    events: SubjectEvents, prediction_time: datetime, mapping: AttributeMap
) -> dict[str, str]:
    """The cohort attributes of a prediction at `prediction_time` (see the module docstring)."""
    found: dict[str, str] = {}
    when = np.datetime64(prediction_time, "us")
    for time, code in zip(events.times, events.codes, strict=True):
        if not np.isnat(time) and time > when:
            break  # events are sorted by time, static ones first
        if code in SEX_CODES:
            found["sex"] = SEX_CODES[code]
        elif code == meds.birth_code and not np.isnat(time):
            found["age_band"] = age_band(time.astype("datetime64[us]").item(), prediction_time)
        for name in mapping.names:
            value = mapping.value(name, code)
            if value is not None:
                found[name] = value
    return found
