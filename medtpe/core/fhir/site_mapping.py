"""The per-site FHIR → MEDS mapping: a declarative YAML file (`default_mapping.yaml` ships).

The file names code systems (matched by URL suffix), the Patient's codes, and per resource type
an ordered list of rules that turn a resource's coding into MEDS code templates
(`"LAB//{code}//{unit}"`). `load_site_mapping` validates it (pydantic: an unknown key, an alias
no rule can reach or a malformed template is a `SiteMappingError` naming the key).

Example::

    mapping = load_site_mapping()  # the shipped default (MIMIC-IV on FHIR + generic rules)
    mapping.rule_for("Observation", [("http://loinc.org", "8867-4")])
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

DEFAULT_MAPPING_PATH = Path(__file__).with_name("default_mapping.yaml")
"""The shipped default mapping."""

PLACEHOLDERS = frozenset(
    {
        "code",
        "display",
        "unit",
        "location",
        "type",
        "admit_source",
        "discharge_disposition",
        "status",
        "status_reason",
        "gender",
        "resource_type",
        "system",
    }
)
"""The names a code template may use (docs/integration.md lists what each one reads)."""

MAPPED_TYPES = (
    "Observation",
    "Condition",
    "Procedure",
    "MedicationAdministration",
    "MedicationRequest",
    "Encounter",
)
"""Resource types with rules (besides Patient, which has its own section)."""

ValueField = Literal["rate", "dose"]
"""Which dosage quantity of a MedicationAdministration is an event's value."""


class SiteMappingError(ValueError):
    """A mapping file that cannot be read or does not follow the schema."""


def _check_template(template: str | None) -> str | None:
    if template is None:
        return None
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None and name not in PLACEHOLDERS:
            raise ValueError(f"unknown placeholder {{{name}}} in {template!r}")
    return template


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rule(_Strict):
    """One mapping rule: which codings (or Encounter classes) it takes, the MEDS codes it makes.

    `code` makes one event at the resource's time (or period start); `start` / `end` make events
    at the period's start / end. `describe`: the coding's display (with the unit) becomes the
    code's description."""

    system: str | None = None
    encounter_class: tuple[str, ...] = Field((), alias="class")
    code: str | None = None
    start: str | None = None
    end: str | None = None
    start_value: ValueField | None = None
    end_value: ValueField | None = None
    describe: bool = False

    @model_validator(mode="after")
    def _valid(self) -> Rule:
        if self.system is None and not self.encounter_class:
            raise ValueError("a rule needs a `system` or an Encounter `class`")
        if self.code is None and self.start is None and self.end is None:
            raise ValueError("a rule needs a `code`, `start` or `end` template")
        for template in (self.code, self.start, self.end):
            _check_template(template)
        return self


class PatientCodes(_Strict):
    """The Patient's events: birth date and gender (its `deceased*` is never an input)."""

    birth: str = "MEDS_BIRTH"
    gender: str = "GENDER//{gender}"
    genders: dict[str, str] = Field(default_factory=dict)


_ALIASES_KEPT = 10_000


class SiteMapping(_Strict):
    """A validated site mapping (see the module docstring and `default_mapping.yaml`)."""

    version: Literal[1] = 1
    subject_identifier_systems: tuple[str, ...] = ()
    systems: dict[str, tuple[str, ...]]
    patient: PatientCodes = Field(default_factory=PatientCodes)
    rules: dict[Literal[*MAPPED_TYPES], tuple[Rule, ...]]  # type: ignore[valid-type]
    unmapped: str = "{resource_type}//{system}//{code}"
    _aliases: dict[str, str | None] = PrivateAttr(default_factory=dict)
    """`system_alias` of each URL seen (a record repeats a few code systems thousands of times)."""

    @model_validator(mode="after")
    def _aliases_known(self) -> SiteMapping:
        for resource_type, rules in self.rules.items():
            for i, rule in enumerate(rules):
                if rule.system is not None and rule.system not in self.systems:
                    raise ValueError(
                        f"rules.{resource_type}[{i}]: system {rule.system!r} is not in `systems`"
                    )
        _check_template(self.unmapped)
        _check_template(self.patient.gender)
        return self

    def system_alias(self, url: str | None) -> str | None:
        """The alias of a code system URL (matched by suffix; None when no alias matches)."""
        if not url:
            return None
        if url not in self._aliases:
            if len(self._aliases) >= _ALIASES_KEPT:
                self._aliases.clear()
            self._aliases[url] = next(
                (alias for alias, suffixes in self.systems.items() if _ends_with(url, suffixes)),
                None,
            )
        return self._aliases[url]

    def rule_for(
        self,
        resource_type: str,
        codings: Sequence[tuple[str | None, str | None]],
        encounter_class: str | None = None,
    ) -> tuple[Rule, int] | None:
        """The first rule of `resource_type` that takes one of `codings` ((system, code) pairs)
        or the Encounter `encounter_class`, with the index of the coding it took (-1: class)."""
        aliases = [self.system_alias(system) for system, _ in codings]
        for rule in self.rules.get(resource_type, ()):  # type: ignore[call-overload]
            if rule.encounter_class and encounter_class in rule.encounter_class:
                return rule, -1
            if rule.system is not None and rule.system in aliases:
                return rule, aliases.index(rule.system)
        return None

    def is_subject_identifier(self, system: str | None) -> bool:
        """Whether a Patient.identifier system names the MEDS subject id."""
        return bool(system) and _ends_with(system, self.subject_identifier_systems)


def load_site_mapping(path: str | Path | None = None) -> SiteMapping:
    """The site mapping in the YAML file `path`; None: the shipped default (MIMIC-IV on FHIR
    plus generic LOINC / SNOMED CT / RxNorm / ICD rules). A `SiteMappingError` names the file
    and the offending key."""
    path = Path(path) if path is not None else DEFAULT_MAPPING_PATH
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise SiteMappingError(f"{path}: cannot read the mapping file ({exc})") from exc
    try:
        return SiteMapping.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '(file)'}: {e['msg']}" for e in exc.errors()
        )
        raise SiteMappingError(f"{path}: {problems}") from exc


def _ends_with(url: str, suffixes: Iterable[str]) -> bool:
    """Whether `url` ends with one of `suffixes` (trailing slashes ignored)."""
    url = url.rstrip("/")
    return any(url.endswith(s.rstrip("/")) for s in suffixes)
