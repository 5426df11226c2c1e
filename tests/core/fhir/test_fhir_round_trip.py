"""The round-trip invariant: an ICU stay of the MIMIC-IV demo, expressed as FHIR R4 in the
MIMIC-IV-on-FHIR code systems (`medtpe.core.fhir.from_meds`) and mapped back by the default site
mapping, renders to the byte-identical text of its MEDS events. On the committed fixture always;
on stays of the shared data when `../shared` is there (all of them: the FHIR mapping benchmark,
`tools/benchmarks/bench_fhir_mapping.py`). The prompt and answer through `/predict`:
tests/service/predict/test_fhir_bundle.py."""

from __future__ import annotations

import json
from collections import ChainMap
from collections.abc import Iterator
from pathlib import Path

import meds
import pytest

from medtpe.core.fhir import load_site_mapping, meds_from_fhir
from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
from medtpe.core.meds import MedsDataset, PredictionPoint, SubjectEvents, read_labels
from medtpe.core.prompt import render_record
from tests.support.mimic_fhir_fixture import FIXTURE
from tests.support.paths import SHARED

SHARED_MEDS = SHARED / "data" / "mimic-iv-demo-meds"
SHARED_STAYS = 2
"""Stays of the shared data checked here (spread over its label file)."""
MAPPING = load_site_mapping()


def stays(root: Path, every: int = 1) -> Iterator[tuple[MedsDataset, PredictionPoint]]:
    dataset = MedsDataset.load(root)
    for point in read_labels(root / "labels" / "icu_mortality.parquet")[::every]:
        yield dataset, point


def round_trip(dataset: MedsDataset, point: PredictionPoint) -> tuple[str, str]:
    """(the MEDS events' text, the text of their FHIR Bundle mapped back) at the stay's
    prediction time. The death is left out of the MEDS side: the mapping never reads it."""
    events = dataset.events(point.subject_id).before(point.prediction_time)
    events = events.take([code != meds.death_code for code in events.codes])
    bundle = json.loads(json.dumps(fhir_bundle_from_meds(events)))  # as it travels
    record = meds_from_fhir(bundle, mapping=MAPPING, prediction_time=point.prediction_time)
    assert record.subject_id == point.subject_id
    assert sum(c.unmapped for c in record.counts.by_type.values()) == 0
    mapped = SubjectEvents.from_events(record.events)
    descriptions = ChainMap(dataset.descriptions, record.descriptions)
    return (
        render_record(events, dataset.descriptions, point.prediction_time).text,
        render_record(mapped, descriptions, point.prediction_time).text,
    )


def test_fixture_stays_render_byte_identical() -> None:
    kinds = set()
    for dataset, point in stays(FIXTURE):
        meds_text, fhir_text = round_trip(dataset, point)
        assert fhir_text == meds_text
        events = dataset.events(point.subject_id).before(point.prediction_time)
        bundle = fhir_bundle_from_meds(events)
        kinds |= {entry["resource"]["resourceType"] for entry in bundle["entry"]}
    assert kinds == {
        "Patient",
        "Observation",
        "Encounter",
        "Condition",
        "Procedure",
        "MedicationAdministration",
        "MedicationRequest",
    }


@pytest.mark.skipif(not SHARED_MEDS.is_dir(), reason="needs ../shared/data/mimic-iv-demo-meds")
def test_shared_stays_render_byte_identical() -> None:
    n_labels = len(read_labels(SHARED_MEDS / "labels" / "icu_mortality.parquet"))
    for dataset, point in stays(SHARED_MEDS, every=n_labels // SHARED_STAYS):
        meds_text, fhir_text = round_trip(dataset, point)
        assert fhir_text == meds_text, point
