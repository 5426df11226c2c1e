"""FHIR R4 → MEDS mapping (`medtpe.core.fhir`): what each resource type becomes under the shipped
site mapping, what is counted, the errors naming resource and field, the mapping file's schema,
synthetic hospital data no one here wrote (clinosim), and properties (hypothesis)."""

from __future__ import annotations

import copy
import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from medtpe.core.fhir import (
    FhirInputError,
    SiteMappingError,
    load_site_mapping,
    meds_from_fhir,
)
from medtpe.core.meds import SubjectEvents
from medtpe.core.prompt import render_record
from medtpe.service.plumbing.json_body import decode_body
from tests.support.clinosim_bundles import read_bundles
from tests.support.paths import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "fhir"
MIMIC = "http://mimic.mit.edu/fhir/mimic/CodeSystem/"
OLD_MIMIC = "http://fhir.mimic.mit.edu/CodeSystem/"
LOINC = "http://loinc.org"
MAPPING = load_site_mapping()


def bundle(*resources: dict[str, Any], patient: dict[str, Any] | None = None) -> dict[str, Any]:
    """A collection Bundle of the patient `p1` (born 2100-01-01) and `resources`."""
    patient = patient or {"resourceType": "Patient", "id": "p1", "birthDate": "2100-01-01"}
    entries = [patient, *resources]
    return {
        "resourceType": "Bundle",
        "type": "collection",
        "entry": [{"resource": r} for r in entries],
    }


def observation(code: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """An Observation of p1 at 2150-01-01 08:00 UTC (heart rate in MIMIC's chart items)."""
    body = {
        "resourceType": "Observation",
        "id": fields.pop("id", "o1"),
        "status": "final",
        "code": code
        or {"coding": [{"system": MIMIC + "mimic-chartevents-d-items", "code": "220045"}]},
        "subject": {"reference": "Patient/p1"},
        "effectiveDateTime": "2150-01-01T08:00:00Z",
    }
    return {**body, **fields}


def mapped(*resources: dict[str, Any], **kwargs: Any) -> list[tuple[Any, ...]]:
    """(time, code, numeric value, text value) of each event of p1's bundle with `resources`."""
    record = meds_from_fhir(bundle(*resources), mapping=MAPPING, **kwargs)
    return [(e.time, e.code, e.numeric_value, e.text_value) for e in record.events]


T8 = datetime(2150, 1, 1, 8)
BIRTH = (datetime(2100, 1, 1), "MEDS_BIRTH", None, None)


def test_patient_birth_and_gender_never_death() -> None:
    patient = {
        "resourceType": "Patient",
        "id": "p1",
        "identifier": [
            {"system": "http://mimic.mit.edu/fhir/mimic/identifier/patient", "value": "10000032"}
        ],
        "birthDate": "2128-01-01",
        "gender": "female",
        "deceasedDateTime": "2180-09-09T00:00:00Z",
    }
    record = meds_from_fhir(bundle(patient=patient), mapping=MAPPING)
    assert record.subject_id == 10000032 and record.patient_id == "p1"
    assert [(e.time, e.code) for e in record.events] == [
        (datetime(2128, 1, 1), "MEDS_BIRTH"),
        (None, "GENDER//F"),
    ]


PATIENT_IDS = "http://mimic.mit.edu/fhir/mimic/identifier/patient"
ABC_HASH = int.from_bytes(hashlib.sha256(b"abc").digest()[:6], "big")
"""The subject id of Patient.id `abc`: the first 48 bits of its SHA-256."""


@pytest.mark.parametrize(
    ("patient", "subject_id"),
    [
        ({"id": "42"}, 42),
        ({"id": "abc"}, ABC_HASH),
        ({"id": "abc", "identifier": [{"system": "urn:x:mrn", "value": "7"}]}, ABC_HASH),
        # digits `int` refuses or that no JSON number holds exactly: the id's hash, never an error
        (
            {"id": "abc", "identifier": [{"system": PATIENT_IDS, "value": "²"}]},
            ABC_HASH,
        ),
        (
            {"id": "abc", "identifier": [{"system": PATIENT_IDS, "value": "9" * 5000}]},
            ABC_HASH,
        ),
        ({"id": "9" * 60}, int.from_bytes(hashlib.sha256(b"9" * 60).digest()[:6], "big")),
    ],
)
def test_subject_id_from_identifier_id_or_hash(patient: dict, subject_id: int) -> None:
    patient = {"resourceType": "Patient", **patient}
    record = meds_from_fhir(bundle(patient=patient), mapping=MAPPING)
    assert record.subject_id == subject_id
    assert all(e.subject_id == subject_id for e in record.events)


def test_a_referenced_patient_id_of_other_digits_is_hashed() -> None:
    """`²` is a digit to `str.isdigit` but not to `int`: the id is hashed, never an error."""
    resource = observation(subject={"reference": "Patient/²"})
    record = meds_from_fhir([resource], mapping=MAPPING)
    assert record.subject_id == int.from_bytes(hashlib.sha256("²".encode()).digest()[:6], "big")


@pytest.mark.parametrize("base", [MIMIC, OLD_MIMIC])
def test_mimic_observations_by_suffix_of_old_and_new_base(base: str) -> None:
    chart = {"coding": [{"system": base + "mimic-chartevents-d-items", "code": "220045"}]}
    lab = {"coding": [{"system": base + "mimic-d-labitems", "code": "50912", "display": "Creat"}]}
    output = {"coding": [{"system": base + "mimic-outputevents-d-items", "code": "226559"}]}
    events = mapped(
        observation(chart, id="a", valueQuantity={"value": 88, "unit": "bpm"}),
        observation(lab, id="b", valueQuantity={"value": 1.2, "unit": "mg/dL"}),
        observation(lab, id="c"),  # no value is legal: an event without one
        observation(output, id="d", valueQuantity={"value": 250, "unit": "ml"}),
    )
    assert events[1:] == [
        (T8, "LAB//220045//bpm", 88.0, None),
        (T8, "LAB//50912//mg/dL", 1.2, None),
        (T8, "LAB//50912//UNK", None, None),
        (T8, "SUBJECT_FLUID_OUTPUT//226559//ml", 250.0, None),
    ]


def test_generic_loinc_carries_display_and_unit_as_description() -> None:
    loinc = {"coding": [{"system": LOINC, "code": "8867-4", "display": "Heart rate"}]}
    panel = observation(
        {"coding": [{"system": LOINC, "code": "85354-9", "display": "BP panel"}]},
        id="bp",
        component=[
            {
                "code": {"coding": [{"system": LOINC, "code": "8480-6", "display": "Systolic"}]},
                "valueQuantity": {"value": 120, "unit": "mmHg", "code": "mm[Hg]"},
            }
        ],
    )
    text = observation(
        {"coding": [{"system": LOINC, "code": "72166-2", "display": "Smoking"}]},
        id="t",
        valueCodeableConcept={
            "coding": [
                {"system": "http://snomed.info/sct", "code": "8517006", "display": "Ex-smoker"}
            ]
        },
    )
    record = meds_from_fhir(
        bundle(observation(loinc, valueQuantity={"value": 80, "unit": "/min"}), panel, text),
        mapping=MAPPING,
    )
    codes = [(e.code, e.numeric_value, e.text_value) for e in record.events[1:]]
    assert codes == [
        ("LOINC//8867-4///min", 80.0, None),
        ("LOINC//8480-6//mmHg", 120.0, None),
        ("LOINC//72166-2//UNK", None, "Ex-smoker"),
    ]
    assert record.descriptions == {
        "LOINC//8867-4///min": "Heart rate [/min]",
        "LOINC//8480-6//mmHg": "Systolic [mmHg]",
        "LOINC//72166-2//UNK": "Smoking",
    }
    text_out = render_record(SubjectEvents.from_events(record.events), record.descriptions).text
    # one instant: the lines in code order (LOINC//72166-2 < LOINC//8480-6 < LOINC//8867-4)
    assert "Smoking: Ex-smoker\nSystolic: 120 mmHg\nHeart rate: 80 /min" in text_out


def test_unmapped_coding_is_kept_with_a_generic_code_and_counted() -> None:
    local = {
        "coding": [
            {"system": "http://hospital.example.org/nursing", "code": "RASS", "display": "Sedation"}
        ]
    }
    record = meds_from_fhir(
        bundle(observation(local, valueQuantity={"value": -2, "unit": "score"})), mapping=MAPPING
    )
    assert [(e.code, e.numeric_value) for e in record.events[1:]] == [
        ("OBSERVATION//nursing//RASS//score", -2.0)
    ]
    assert record.descriptions == {"OBSERVATION//nursing//RASS//score": "Sedation [score]"}
    assert record.counts.as_dict()["Observation"] == {
        "mapped": 0,
        "unmapped": 1,
        "after_prediction_time": 0,
        "outside_window": 0,
        "dropped_elements": 0,
        "skipped": 0,
    }


def test_encounters_conditions_procedures_medications() -> None:
    encounter = {
        "resourceType": "Encounter",
        "id": "icu",
        "status": "finished",
        "class": {"code": "ACUTE"},
        "subject": {"reference": "Patient/p1"},
        "period": {"start": "2150-01-01T06:00:00Z", "end": "2150-01-03T06:00:00Z"},
        "location": [{"location": {"display": "Medical Intensive Care Unit (MICU)"}}],
    }
    condition = {  # no onset: the encounter's end
        "resourceType": "Condition",
        "id": "c",
        "code": {"coding": [{"system": MIMIC + "mimic-diagnosis-icd10", "code": "A419"}]},
        "subject": {"reference": "Patient/p1"},
        "encounter": {"reference": "Encounter/icu"},
    }
    infusion = {
        "resourceType": "MedicationAdministration",
        "id": "m",
        "status": "completed",
        "medicationCodeableConcept": {
            "coding": [{"system": MIMIC + "mimic-medication-icu", "code": "221906"}]
        },
        "subject": {"reference": "Patient/p1"},
        "effectivePeriod": {"start": "2150-01-01T07:00:00Z", "end": "2150-01-01T09:00:00Z"},
        "dosage": {"rateQuantity": {"value": 0.1}, "dose": {"value": 2.5}},
    }
    procedure = {
        "resourceType": "Procedure",
        "id": "pr",
        "status": "completed",
        "code": {"coding": [{"system": MIMIC + "mimic-procedure-d-items", "code": "225792"}]},
        "subject": {"reference": "Patient/p1"},
        "performedPeriod": {"start": "2150-01-01T06:30:00-05:00"},
    }
    request = {
        "resourceType": "MedicationRequest",
        "id": "rx",
        "status": "active",
        "intent": "order",
        "medicationCodeableConcept": {
            "coding": [
                {
                    "system": MIMIC + "mimic-medication-name",
                    "code": "Heparin",
                    "display": "Heparin ",
                }
            ]
        },
        "subject": {"reference": "Patient/p1"},
        "dispenseRequest": {"validityPeriod": {"start": "2150-01-01T06:10:00Z"}},
    }
    events = mapped(encounter, condition, infusion, procedure, request)
    assert events[1:] == [
        (datetime(2150, 1, 1, 6), "ICU_ADMISSION//Medical Intensive Care Unit (MICU)", None, None),
        (datetime(2150, 1, 3, 6), "ICU_DISCHARGE//Medical Intensive Care Unit (MICU)", None, None),
        (datetime(2150, 1, 3, 6), "DIAGNOSIS//ICD//10//A419", None, None),
        (datetime(2150, 1, 1, 7), "INFUSION_START//221906", 0.1, None),
        (datetime(2150, 1, 1, 9), "INFUSION_END//221906", 2.5, None),
        (datetime(2150, 1, 1, 11, 30), "PROCEDURE//START//225792", None, None),  # UTC
        (datetime(2150, 1, 1, 6, 10), "MEDICATION//START//Heparin ", None, None),
    ]


def test_events_after_the_prediction_time_are_dropped_and_counted() -> None:
    late = observation(id="late", effectiveDateTime="2150-01-01T09:00:00Z")
    record = meds_from_fhir(
        bundle(observation(), late), mapping=MAPPING, prediction_time=datetime(2150, 1, 1, 8)
    )
    assert [e.code for e in record.events] == ["MEDS_BIRTH", "LAB//220045//UNK"]
    counts = record.counts.as_dict()["Observation"]
    assert (counts["mapped"], counts["after_prediction_time"]) == (1, 1)


def test_skipped_resources_are_counted() -> None:
    practitioner = {"resourceType": "Practitioner", "id": "dr"}
    wrong = observation(id="x", status="entered-in-error")
    record = meds_from_fhir(bundle(practitioner, wrong), mapping=MAPPING)
    assert [e.code for e in record.events] == ["MEDS_BIRTH"]
    assert record.counts.as_dict()["Practitioner"]["skipped"] == 1
    assert record.counts.as_dict()["Observation"]["skipped"] == 1
    assert record.counts.n_resources == 3


@pytest.mark.parametrize(
    ("change", "loc", "words"),
    [
        (lambda o: o.pop("code"), ["entry", 1, "resource", "code"], "required"),
        (
            lambda o: o.pop("effectiveDateTime"),
            ["entry", 1, "resource", "effectiveDateTime"],
            "time",
        ),
        (
            lambda o: o.update(valueRange={"low": {"value": 1}}),
            ["entry", 1, "resource", "valueRange"],
            "cannot be rendered",
        ),
        (
            lambda o: o.update(subject={"reference": "Patient/p2"}),
            ["entry", 1, "resource", "subject", "reference"],
            "another patient",
        ),
        (  # an R5 element: not FHIR R4
            lambda o: o.update(
                triggeredBy=[{"observation": {"reference": "Observation/x"}, "type": "reflex"}]
            ),
            ["entry", 1, "resource", "triggeredBy"],
            "not a FHIR R4 element",
        ),
        (
            lambda o: o.update(resourceType="ActorDefinition"),  # an R5-only resource type
            ["entry", 1, "resource", "resourceType"],
            "not a FHIR R4 resource type",
        ),
    ],
)
def test_bad_input_names_resource_and_field(change: Any, loc: list, words: str) -> None:
    bad = observation()
    change(bad)
    with pytest.raises(FhirInputError) as caught:
        meds_from_fhir(bundle(bad), mapping=MAPPING)
    assert caught.value.loc == loc
    assert words in str(caught.value) and "entry 1" in str(caught.value)


def test_bundle_type_and_a_list_of_resources() -> None:
    with pytest.raises(FhirInputError, match="type 'history'") as caught:
        meds_from_fhir({**bundle(), "type": "history"}, mapping=MAPPING)
    assert caught.value.loc == ["type"]
    with pytest.raises(FhirInputError, match=r"type \{\}"):  # found by the API contract fuzzer
        meds_from_fhir({**bundle(), "type": {}}, mapping=MAPPING)
    resources = [e["resource"] for e in bundle(observation())["entry"]]
    record = meds_from_fhir(resources, mapping=MAPPING)
    assert [e.code for e in record.events] == ["MEDS_BIRTH", "LAB//220045//UNK"]
    with pytest.raises(FhirInputError) as caught:
        meds_from_fhir([*resources, {"resourceType": "Observation"}], mapping=MAPPING)
    assert caught.value.loc[0] == 2


def test_the_sample_bundle_of_the_guide() -> None:
    sample = json.loads((FIXTURES / "sample_bundle.json").read_text())
    record = meds_from_fhir(sample, mapping=MAPPING)
    counts = record.counts.as_dict()
    assert counts["Observation"] == {
        "mapped": 4,
        "unmapped": 1,
        "after_prediction_time": 0,
        "outside_window": 0,
        "dropped_elements": 0,
        "skipped": 0,
    }
    assert record.subject_id == 900001
    assert "ICU_ADMISSION//Medical Intensive Care Unit (MICU)" in [e.code for e in record.events]


def test_mapping_file_errors_name_the_key(tmp_path: Path) -> None:
    text = (FIXTURES.parents[2] / "medtpe" / "core" / "fhir" / "default_mapping.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace('"LAB//{code}//{unit}"', '"LAB//{itemid}"', 1))
    with pytest.raises(SiteMappingError, match=r"unknown placeholder \{itemid\}"):
        load_site_mapping(bad)
    bad.write_text(text.replace("system: chart_item", "system: chart_items", 1))
    with pytest.raises(SiteMappingError, match="chart_items"):
        load_site_mapping(bad)
    with pytest.raises(SiteMappingError, match="cannot read"):
        load_site_mapping(tmp_path / "missing.yaml")


def test_a_site_mapping_changes_the_codes(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(
        "systems: {local: [/nursing]}\n"
        "rules:\n  Observation:\n    - {system: local, code: 'NURSING//{code}', describe: true}\n"
    )
    local = {"coding": [{"system": "http://h.org/nursing", "code": "RASS", "display": "Sedation"}]}
    record = meds_from_fhir(
        bundle(observation(local, valueInteger=-2)), mapping=load_site_mapping(site)
    )
    assert [(e.code, e.numeric_value) for e in record.events[1:]] == [("NURSING//RASS", -2.0)]


CLINOSIM = read_bundles(FIXTURES / "clinosim")


@pytest.mark.parametrize(("name", "data"), CLINOSIM, ids=[name for name, _ in CLINOSIM])
def test_synthetic_hospital_bundles_map_or_name_the_field(name: str, data: dict) -> None:
    """clinosim's resources are all counted (mapped, unmapped or skipped); a resource that is not
    valid FHIR R4 is an error naming its entry and field, never another exception."""
    try:
        record = meds_from_fhir(data, mapping=MAPPING)
    except FhirInputError as exc:
        assert name == "patient-3.json.gz"  # clinosim writes dosage.doseAndRate (not R4)
        assert exc.loc[-2:] == ["dosage", "doseAndRate"]
        assert data["entry"][exc.loc[1]]["resource"]["resourceType"] == "MedicationAdministration"
        return
    assert record.counts.n_resources == len(data["entry"])
    counts = record.counts.as_dict()
    assert counts["Observation"]["mapped"] > 0 and counts["Condition"]["mapped"] > 0
    assert counts["Patient"]["mapped"] == 1
    assert record.events and all(e.subject_id == record.subject_id for e in record.events)


# --- properties ---------------------------------------------------------------------------------

_codings = st.fixed_dictionaries(
    {
        "system": st.sampled_from(
            [MIMIC + "mimic-chartevents-d-items", LOINC, "http://snomed.info/sct", "urn:x:local"]
        ),
        "code": st.from_regex(r"[A-Za-z0-9.\-]{1,8}", fullmatch=True),
    },
    optional={"display": st.text(min_size=1, max_size=20).filter(lambda s: s.strip() == s)},
)
_values = st.one_of(
    st.fixed_dictionaries(
        {
            "valueQuantity": st.fixed_dictionaries(
                {},
                optional={
                    "value": st.floats(-1e6, 1e6),
                    "unit": st.sampled_from(["mg/dL", "%", "bpm"]),
                },
            )
        }
    ),
    st.fixed_dictionaries({"valueInteger": st.integers(-1000, 1000)}),
    st.fixed_dictionaries(
        {"valueString": st.from_regex(r"[a-z]{1,10}( [a-z]{1,10})?", fullmatch=True)}
    ),
    st.fixed_dictionaries({"valueBoolean": st.booleans()}),
    st.fixed_dictionaries({"valueRatio": st.just({"numerator": {"value": 1}})}),
    st.just({}),
)
_times = st.datetimes(datetime(1900, 1, 1), datetime(2200, 1, 1)).map(lambda t: t.isoformat() + "Z")
_observations = st.builds(
    lambda coding, value, time, status: {
        "resourceType": "Observation",
        "status": status,
        "code": {"coding": [coding]},
        "subject": {"reference": "Patient/p1"},
        "effectiveDateTime": time,
        **value,
    },
    _codings,
    _values,
    _times,
    st.sampled_from(["final", "amended", "entered-in-error", "preliminary"]),
)


@given(
    st.lists(_observations, max_size=8),
    st.none() | st.datetimes(datetime(1900, 1, 1), datetime(2200, 1, 1)),
)
def test_valid_resources_never_raise_anything_but_fhir_input_error(
    observations: list[dict], prediction_time: datetime | None
) -> None:
    data = bundle(*observations)
    before = copy.deepcopy(data)
    try:
        first = meds_from_fhir(data, mapping=MAPPING, prediction_time=prediction_time)
    except FhirInputError as exc:
        assert exc.loc[:3] == ["entry", exc.loc[1], "resource"]
        return
    assert data == before  # the input is not modified
    again = meds_from_fhir(data, mapping=MAPPING, prediction_time=prediction_time)
    assert first == again  # a pure function of its input
    assert first.counts.n_resources == len(data["entry"])
    if prediction_time is not None:
        assert all(e.time is None or e.time <= prediction_time for e in first.events)
    assert _read_as_predict_reads(data, prediction_time) == first


def _outcome(data: Any, prediction_time: datetime | None = None) -> Any:
    """The record, or the error's message and location."""
    try:
        return meds_from_fhir(data, mapping=MAPPING, prediction_time=prediction_time)
    except FhirInputError as exc:
        return exc.message, exc.loc


def _read_as_predict_reads(data: Any, prediction_time: datetime | None = None) -> Any:
    """The outcome of `data` as `/predict`'s body reader gives it: its resources as JSON text."""
    body = decode_body(json.dumps({"task": "icu_mortality", "bundle": data}).encode())
    return _outcome(body["bundle"], prediction_time)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_resource_types = st.sampled_from(
    ["Patient", "Observation", "Encounter", "Condition", "Practitioner"]
)


@given(
    st.fixed_dictionaries(
        {
            "resourceType": st.just("Bundle"),
            "type": st.sampled_from(["collection", "searchset"]) | _json,
        },
        optional={
            "entry": st.lists(
                st.fixed_dictionaries(
                    {"resource": st.fixed_dictionaries({"resourceType": _resource_types}) | _json},
                    optional={"fullUrl": _json},
                )
                | _json,
                max_size=4,
            )
            | _json
        },
    )
)
def test_any_json_bundle_raises_nothing_but_fhir_input_error(data: dict) -> None:
    assert _read_as_predict_reads(data) == _outcome(data)  # its resources as text or as objects
    try:
        record = meds_from_fhir(data, mapping=MAPPING)
    except FhirInputError as exc:
        assert exc.message and isinstance(exc.loc, list)
        return
    given_resources = [e for e in data.get("entry") or [] if e.get("resource") is not None]
    assert record.counts.n_resources == len(given_resources)
