"""A FHIR record read only as far as its prompt reaches (`medtpe.core.fhir.window`): the prompt is
the whole record's or says it reaches a resource not read (`Prompt.reaches`, never a different
text unannounced), the counts are
the whole record's, every resource gets the first pass's checks, and what only the R4
validation refuses is looked at in the resources the prompt can reach only (the documented
rule, docs/integration.md "FHIR records")."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from medtpe.core.fhir import (
    FhirInputError,
    FhirRecord,
    ResourceCache,
    load_site_mapping,
    meds_from_fhir,
)
from medtpe.core.fhir import window as window_module
from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
from medtpe.core.fhir.window import FhirWindow
from medtpe.core.meds import MedsDataset, read_labels
from medtpe.core.prompt import ChatTemplate, Windowing, WindowPolicy
from medtpe.core.prompt.task_prompt import build_prompt
from medtpe.core.tasks import get_task
from medtpe.core.tokenizer import BaseTokenizer
from tests.support import render_pins
from tests.support.mimic_fhir_fixture import FIXTURE

MAPPING = load_site_mapping()
TASK = get_task("icu_mortality")


base = pytest.fixture(scope="module", name="base")(render_pins.base_tokenizer)
template = pytest.fixture(scope="module", name="template")(render_pins.template)


@pytest.fixture(scope="module")
def stay() -> dict[str, Any]:
    """The fixture's first ICU stay up to its prediction time, as a FHIR Bundle."""
    point = read_labels(FIXTURE / "labels" / "icu_mortality.parquet")[0]
    events = MedsDataset.load(FIXTURE).events(point.subject_id).before(point.prediction_time)
    return fhir_bundle_from_meds(events)


def prompt_text(
    record: FhirRecord,
    base: BaseTokenizer,
    template: ChatTemplate,
    budget: int,
    windowing: Windowing,
) -> str | None:
    """The prompt of `record`; None when it reaches back to a resource not read."""
    prompt = build_prompt(
        TASK,
        record.subject_events(),
        None,
        base,
        template,
        budget,
        record.descriptions,
        windowing=windowing,
        horizon=record.horizon,
    )
    return None if prompt.reaches(record.horizon) else prompt.text


def observations_oldest_first(bundle: dict[str, Any]) -> list[dict[str, Any]]:
    found = [
        e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] == "Observation"
    ]
    return sorted(found, key=lambda r: r["effectiveDateTime"])


@pytest.mark.parametrize("budget", [512, 1536])
@pytest.mark.parametrize("policy", [WindowPolicy.SLIDING, WindowPolicy.STABLE])
def test_a_window_prompt_is_the_whole_records_or_refused(
    stay: dict, base: BaseTokenizer, template: ChatTemplate, budget: int, policy: WindowPolicy
) -> None:
    windowing = Windowing(policy, grid_hours=1)
    whole = prompt_text(meds_from_fhir(stay, mapping=MAPPING), base, template, budget, windowing)
    window = FhirWindow(stay, mapping=MAPPING)
    accepted = []
    for n in [1, 2, 4, 8, 16, 32, 64, 128, 256, None]:
        record = window.record(n)
        text = prompt_text(record, base, template, budget, windowing)
        if text is None:
            continue
        assert text == whole
        accepted.append(sum(c.outside_window for c in record.counts.by_type.values()))
    assert accepted[-1] == 0  # the whole record read
    assert max(accepted) > 0  # and some window left resources out


def test_the_counts_are_the_whole_records(stay: dict) -> None:
    whole = meds_from_fhir(stay, mapping=MAPPING).counts.as_dict()
    record = FhirWindow(stay, mapping=MAPPING).record(8)
    counts = record.counts.as_dict()
    outside = sum(by_type.pop("outside_window") for by_type in counts.values())
    assert sum(by_type.pop("outside_window") for by_type in whole.values()) == 0
    assert counts == whole
    assert outside > 0
    every_event = meds_from_fhir(stay, mapping=MAPPING).subject_events()
    assert len(record.subject_events()) == len(every_event)
    assert record.horizon is not None and len(record.rows) < len(every_event)


def _set(field: str, value: Any) -> Callable[[dict], None]:
    return lambda resource: resource.__setitem__(field, value)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (_set("effectiveDateTime", "2150-01-01T08:00:00"), "effectiveDateTime", "regex"),
        (_set("subject", {"reference": "Patient/someone-else"}), "subject.reference", "another"),
        (_set("resourceType", "Observatio"), "resourceType", "not a FHIR R4 resource type"),
        (_set("code", {"coding": [{"system": "http://loinc.org"}]}), "code", "code is required"),
        (_set("valueRange", {"low": {"value": 1}}), "valueRange", "cannot be rendered"),
        (lambda r: r.pop("effectiveDateTime"), "effectiveDateTime", "needs a time"),
    ],
)
def test_the_first_pass_checks_every_resource(
    stay: dict, change: Callable[[dict], None], field: str, words: str
) -> None:
    bundle = copy.deepcopy(stay)
    change(observations_oldest_first(bundle)[0])
    with pytest.raises(FhirInputError) as raised:
        FhirWindow(bundle, mapping=MAPPING).record(1)
    assert raised.value.field == field
    assert words in str(raised.value)


def test_outside_the_window_only_the_r4_validation_refuses(stay: dict) -> None:
    """The documented rule: a flaw only the R4 models see is refused in a resource the prompt
    can reach, and counted (`outside_window`) in an older one."""
    bundle = copy.deepcopy(stay)
    _set("bogusElement", 1)(observations_oldest_first(bundle)[0])
    window = FhirWindow(bundle, mapping=MAPPING)
    record = window.record(8)
    assert record.counts.of("Observation").outside_window > 0
    with pytest.raises(FhirInputError):
        window.record(None)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (_set("issued", "not-a-time"), "issued"),
        (_set("valueQuantity", {"value": "x", "unit": "bpm"}), "valueQuantity.value"),
        (_set("valueQuantity", {"value": 1, "code": " "}), "valueQuantity.code"),
    ],
)
def test_a_faulty_element_read_is_left_out_and_named(
    stay: dict, change: Callable[[dict], None], field: str
) -> None:
    """An element whose own value is faulty is left out of a resource read, counted and named;
    outside the window it is not looked at."""
    bundle = copy.deepcopy(stay)
    change(observations_oldest_first(bundle)[0])
    window = FhirWindow(bundle, mapping=MAPPING)
    assert window.record(8).warnings == []
    record = window.record(None)
    (warning,) = record.warnings
    assert record.counts.of("Observation").dropped_elements == 1
    assert warning.loc[3:] == tuple(field.split(".")) and "left out" in warning.text
    whole = meds_from_fhir(bundle, mapping=MAPPING)
    assert whole.warnings == record.warnings and whole.rows == record.rows


def test_a_re_asked_window_reads_no_resource_the_cache_holds(
    stay: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked again with a resource cache, the window counts the resources the cache holds read
    among the newest: it validates none of them again and no older one in their place."""
    texts = [json.dumps(entry["resource"]).encode() for entry in stay["entry"]]
    cache = ResourceCache(MAPPING, 2**26)
    cold = FhirWindow(texts, mapping=MAPPING, cache=cache).record(16)
    validated: list[int] = []
    real = window_module.parse_resource

    def counted(data: Any, index: int, *args: Any) -> Any:
        validated.append(index)
        return real(data, index, *args)

    monkeypatch.setattr(window_module, "parse_resource", counted)
    again = FhirWindow(texts, mapping=MAPPING, cache=cache).record(16)
    assert validated == []
    assert again.horizon == cold.horizon and len(again.rows) == len(cold.rows) > 0
    assert again.counts.as_dict() == cold.counts.as_dict()
