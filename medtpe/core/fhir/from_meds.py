"""MEDS → FHIR R4, for test fixtures and benchmarks: one subject's MIMIC-IV MEDS events as a
Bundle in the MIMIC-IV-on-FHIR code systems, which the default site mapping maps back to the very
same events (the round-trip invariant, tests/core/fhir/test_fhir_round_trip.py).

One resource per MEDS event, in the events' order (events sharing a timestamp keep their order,
which the rendered text shows): an event that opens or closes a period (an infusion, an ICU
stay, a prescription) is a resource with only that end of its period. The Patient carries the
birth date, the gender and the date of death (`deceasedDateTime`, which the mapping never reads).
Events with no MIMIC-IV-on-FHIR home (outpatient measurements such as `Blood Pressure`, `DRG//…`,
`SUBJECT_WEIGHT_AT_INFUSION//KG`) are Observations in the project's `meds-code` code system,
which carries a MEDS code verbatim.

    bundle = fhir_bundle_from_meds(dataset.events(subject_id))
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime
from typing import Any

import meds
import numpy as np

from medtpe.core.meds.events import SubjectEvents

MIMIC_CODE_SYSTEMS = "http://mimic.mit.edu/fhir/mimic/CodeSystem/"
"""Base URL of the MIMIC-IV-on-FHIR code systems (the older base ends in the same names)."""
MIMIC_PATIENT_IDENTIFIER = "http://mimic.mit.edu/fhir/mimic/identifier/patient"
"""The identifier system of MIMIC-IV-on-FHIR's subject_id."""
MEDS_CODE_SYSTEM = "urn:medtpe:fhir/CodeSystem/meds-code"
"""The project's code system of MEDS codes carried verbatim."""
CHART_ITEM_MIN = 220_000
"""MIMIC-IV ICU item ids (d_items) start here; lower `LAB//` ids are hospital lab items."""
_GENDERS = {"F": "female", "M": "male", "O": "other", "UNK": "unknown"}
_ACT_CODE = "http://terminology.hl7.org/CodeSystem/v3-ActCode"


def _instant(time: np.datetime64) -> str:
    """A naive (UTC) MEDS time as a FHIR dateTime with its `Z`."""
    return f"{time.astype('datetime64[us]').item().isoformat()}Z"


def _coding(system: str, code: str) -> dict[str, Any]:
    """A CodeableConcept of a MIMIC code system; a name that is no valid FHIR code (runs of
    spaces, spaces at its ends) is the display of its normalised code."""
    normalised = " ".join(code.split())
    coding = {"system": MIMIC_CODE_SYSTEMS + system, "code": normalised or "UNK"}
    if normalised != code:
        coding["display"] = code
    return {"coding": [coding]}


class _Writer:
    """The Bundle of one subject, written event by event."""

    def __init__(self, subject_id: int) -> None:
        self.patient_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"mimic/patient/{subject_id}"))
        self.patient: dict[str, Any] = {
            "resourceType": "Patient",
            "id": self.patient_id,
            "identifier": [{"system": MIMIC_PATIENT_IDENTIFIER, "value": str(subject_id)}],
        }
        self.resources: list[dict[str, Any]] = [self.patient]
        self.discharges: dict[str, str] = {}  # discharge time -> Encounter id

    def add(self, resource_type: str, body: dict[str, Any]) -> str:
        resource_id = f"{resource_type.lower()}-{len(self.resources)}"
        self.resources.append(
            {
                "resourceType": resource_type,
                "id": resource_id,
                **body,
                "subject": {"reference": f"Patient/{self.patient_id}"},
            }
        )
        return resource_id

    def observation(self, concept: dict[str, Any], at: str, value: float, text: str | None) -> None:
        body: dict[str, Any] = {"status": "final", "code": concept, "effectiveDateTime": at}
        unit = concept.pop("unit", None)
        if not math.isnan(value):
            body["valueQuantity"] = {"value": value, **({"unit": unit} if unit else {})}
        elif text is not None:
            body["valueString"] = text
        elif unit:
            body["valueQuantity"] = {"unit": unit}  # a unit and no number: the code keeps it
        self.add("Observation", body)

    def encounter(
        self, encounter_class: str, start: str | None, end: str | None, **more: Any
    ) -> str:
        period = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
        body = {
            "status": "finished" if end else "in-progress",
            "class": {"system": _ACT_CODE, "code": encounter_class},
            "period": period,
            **more,
        }
        return self.add("Encounter", body)

    def event(self, time: np.datetime64, code: str, value: float, text: str | None) -> None:
        """One MEDS event as a resource (or as the Patient's birth date / gender / death); a code
        of no MIMIC-IV-on-FHIR home is an Observation in the MEDS code system."""
        parts = code.split("//")
        if np.isnat(time):
            self.static(code, parts)
            return
        at = _instant(time)
        if not (
            self.patient_fact(time, code, at)
            or self.measurement(code, parts, at, value, text)
            or self.medication(parts, at, value)
            or self.procedure(parts, at)
            or self.stay(code, parts, at)
        ):
            self.meds_observation(code, at, value, text)

    def static(self, code: str, parts: list[str]) -> None:
        """A static event (no time): the Patient's gender, or an error."""
        if parts[0] == "GENDER" and len(parts) == 2 and parts[1] in _GENDERS:
            self.patient["gender"] = _GENDERS[parts[1]]
            return
        raise ValueError(f"no FHIR home for the static event {code!r}")

    def patient_fact(self, time: np.datetime64, code: str, at: str) -> bool:
        """The Patient's birth date (a birth at midnight) or death time; False: neither."""
        clock = time.astype("datetime64[us]").item()
        if code == meds.birth_code and clock == datetime(clock.year, clock.month, clock.day):
            self.patient["birthDate"] = clock.date().isoformat()
        elif code == meds.death_code:
            self.patient["deceasedDateTime"] = at
        else:
            return False
        return True

    def measurement(
        self, code: str, parts: list[str], at: str, value: float, text: str | None
    ) -> bool:
        """A lab, chart or output item as an Observation in its d_items system (an output of
        no unit in the MEDS code system); False: no such item."""
        head = parts[0]
        if not (head in ("LAB", "SUBJECT_FLUID_OUTPUT") and len(parts) == 3 and parts[1].isdigit()):
            return False
        system = (
            "mimic-outputevents-d-items"
            if head == "SUBJECT_FLUID_OUTPUT"
            else "mimic-chartevents-d-items"
            if int(parts[1]) >= CHART_ITEM_MIN
            else "mimic-d-labitems"
        )
        if head == "SUBJECT_FLUID_OUTPUT" and parts[2] == "UNK":
            self.meds_observation(code, at, value, text)
            return True
        concept = _coding(system, parts[1])
        if parts[2] != "UNK":
            concept["unit"] = parts[2]
        self.observation(concept, at, value, text)
        return True

    def medication(self, parts: list[str], at: str, value: float) -> bool:
        """An infusion's start or end, a prescription's start or stop, or a medication given, as
        a MedicationAdministration or MedicationRequest; False: none of these."""
        head = parts[0]
        if head in ("INFUSION_START", "INFUSION_END") and len(parts) == 2:
            start = head == "INFUSION_START"
            body: dict[str, Any] = {
                "status": "completed",
                "medicationCodeableConcept": _coding("mimic-medication-icu", parts[1]),
                "effectivePeriod": {"start" if start else "end": at},
            }
            if not math.isnan(value):
                body["dosage"] = {"rateQuantity" if start else "dose": {"value": value}}
            self.add("MedicationAdministration", body)
        elif head == "MEDICATION" and len(parts) == 3 and parts[1] in ("START", "STOP"):
            self.add(
                "MedicationRequest",
                {
                    "status": "active" if parts[1] == "START" else "stopped",
                    "intent": "order",
                    "medicationCodeableConcept": _coding("mimic-medication-name", parts[2]),
                    "dispenseRequest": {
                        "validityPeriod": {"start" if parts[1] == "START" else "end": at}
                    },
                },
            )
        elif head == "MEDICATION" and len(parts) == 3:
            self.add(
                "MedicationAdministration",
                {
                    "status": "completed",
                    "medicationCodeableConcept": _coding("mimic-medication-name", parts[1]),
                    "statusReason": [{"text": parts[2]}],
                    "effectiveDateTime": at,
                },
            )
        else:
            return False
        return True

    def procedure(self, parts: list[str], at: str) -> bool:
        """An ICU procedure's start or end, an ICD procedure or diagnosis, or a HCPCS code, as a
        Procedure or Condition; False: none of these."""
        head = parts[0]
        if head == "PROCEDURE" and len(parts) == 3 and parts[1] in ("START", "END"):
            self.add(
                "Procedure",
                {
                    "status": "completed",
                    "code": _coding("mimic-procedure-d-items", parts[2]),
                    "performedPeriod": {"start" if parts[1] == "START" else "end": at},
                },
            )
        elif head in ("PROCEDURE", "DIAGNOSIS") and len(parts) == 4 and parts[1] == "ICD":
            kind = "procedure" if head == "PROCEDURE" else "diagnosis"
            concept = _coding(f"mimic-{kind}-icd{parts[2]}", parts[3])
            if head == "PROCEDURE":
                self.add(
                    "Procedure", {"status": "completed", "code": concept, "performedDateTime": at}
                )
            elif at in self.discharges:  # no onset: the admission's end is the time
                encounter = {"reference": f"Encounter/{self.discharges[at]}"}
                self.add("Condition", {"code": concept, "encounter": encounter})
            else:
                self.add("Condition", {"code": concept, "onsetDateTime": at})
        elif head == "HCPCS" and len(parts) == 2:
            concept = _coding("mimic-hcpcs-cd", parts[1])
            self.add("Procedure", {"status": "completed", "code": concept, "performedDateTime": at})
        else:
            return False
        return True

    def stay(self, code: str, parts: list[str], at: str) -> bool:
        """A hospital admission or discharge, an ED registration or exit, an ICU admission or
        discharge, or a transfer, as an Encounter; False: none of these."""
        head = parts[0]
        if head == "HOSPITAL_ADMISSION" and len(parts) == 3:
            self.encounter(
                "IMP",
                at,
                None,
                type=[_coding("mimic-admission-type", parts[1])],
                hospitalization={"admitSource": _coding("mimic-admit-source", parts[2])},
            )
        elif head == "HOSPITAL_DISCHARGE" and len(parts) == 2:
            disposition = _coding("mimic-discharge-disposition", parts[1])
            self.discharges[at] = self.encounter(
                "IMP", None, at, hospitalization={"dischargeDisposition": disposition}
            )
        elif code in ("ED_REGISTRATION", "ED_OUT"):
            registration = code == "ED_REGISTRATION"
            self.encounter("EMER", at if registration else None, None if registration else at)
        elif head in ("ICU_ADMISSION", "ICU_DISCHARGE") and len(parts) == 2:
            start = head == "ICU_ADMISSION"
            location = [{"location": {"display": parts[1]}}]
            self.encounter("ACUTE", at if start else None, None if start else at, location=location)
        elif head == "TRANSFER_TO" and len(parts) == 3:
            self.encounter(
                "IMP",
                at,
                None,
                type=[_coding("mimic-transfer-type", parts[1])],
                location=[{"location": {"display": parts[2]}}],
            )
        else:
            return False
        return True

    def meds_observation(self, code: str, at: str, value: float, text: str | None) -> None:
        concept = {"coding": [{"system": MEDS_CODE_SYSTEM, "code": code}]}
        self.observation(concept, at, value, text)


def fhir_bundle_from_meds(events: SubjectEvents, bundle_type: str = "collection") -> dict[str, Any]:
    """One subject's MIMIC-IV MEDS events as a FHIR R4 Bundle (a JSON-able dict) in the
    MIMIC-IV-on-FHIR code systems; see the module docstring."""
    writer = _Writer(events.subject_id)
    for i in range(len(events)):
        text = events.text_values[i]
        writer.event(events.times[i], events.codes[i], float(events.numeric_values[i]), text)
    return {
        "resourceType": "Bundle",
        "type": bundle_type,
        "entry": [{"fullUrl": _full_url(r), "resource": r} for r in writer.resources],
    }


def _full_url(resource: dict[str, Any]) -> str:
    name = f"{resource['resourceType']}/{resource['id']}"
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, name)}"
