"""The CDS Hooks logic without HTTP: risk bands, the card's text, prefetch templates, the score
cache and record digest."""

from __future__ import annotations

from datetime import datetime

import pytest
from pydantic import ValidationError

from medtpe.core.cds.cards import SUMMARY_LIMIT, Score, card_text
from medtpe.core.cds.risk import DEFAULT_TASK_BANDS, Indicator, RiskBands
from medtpe.core.cds.score_cache import record_digest
from medtpe.core.cds.services import (
    HOOK_CONTEXT,
    SERVICES,
    TemplateError,
    get_service,
    render_template,
)
from medtpe.core.meds import MedsEvent, SubjectEvents
from medtpe.core.tasks import get_task

BANDS = RiskBands(warning=0.2, critical=0.5)


def score(probability: float | None, **changes: object) -> Score:
    values: dict[str, object] = {
        "task_title": "ICU mortality",
        "question": "Will the patient die during this ICU stay?",
        "p_yes": probability,
        "prediction_time": datetime(2150, 1, 3, 10, 16),
        "events_total": 530,
        "events_kept": 412,
        "first_event": datetime(2150, 1, 1, 8, 0),
        "last_event": datetime(2150, 1, 3, 10, 15),
        "input_budget": 8192,
        "original_tokens": 8100,
        "medtpe_tokens": 5800,
        "compression_rate": 1 - 5800 / 8100,
        "model": "smollm2-135m-instruct",
        "mode": "medtpe",
        "artefact_id": "abc123",
        "computed_at": datetime(2026, 11, 25, 10, 0),
        "mapping": {"resources": 1204, "unmapped": 3},
    }
    return Score(**(values | changes))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("p", "indicator", "name"),
    [
        (0.0, Indicator.INFO, "low"),
        (0.199, Indicator.INFO, "low"),
        (0.2, Indicator.WARNING, "elevated"),
        (0.4999, Indicator.WARNING, "elevated"),
        (0.5, Indicator.CRITICAL, "high"),
        (1.0, Indicator.CRITICAL, "high"),
    ],
)
def test_a_probability_falls_in_its_band_lower_bound_included(
    p: float, indicator: Indicator, name: str
) -> None:
    band = BANDS.band(p)
    assert (band.indicator, band.name) == (indicator, name)


def test_bands_must_be_ordered_probabilities() -> None:
    for bad in ({"warning": 0.6, "critical": 0.5}, {"warning": -0.1, "critical": 0.5}):
        with pytest.raises(ValidationError):
            RiskBands.model_validate(bad)
    assert set(DEFAULT_TASK_BANDS) == {"icu_mortality", "readmission_30d"}


def test_the_card_states_risk_window_model_compression_and_time() -> None:
    text = card_text(score(0.83), BANDS, cached=False)
    assert (text.indicator, text.summary) == (Indicator.CRITICAL, "ICU mortality: high risk (83%)")
    detail = text.detail
    assert "**Probability:** 0.83" in detail and "high (0.50 or more)" in detail
    assert "412 of 530 events" in detail and "118 older events left out" in detail
    assert "recorded 2150-01-01 08:00 to 2150-01-03 10:15" in detail
    assert "prediction time 2150-01-03 10:16" in detail
    assert "artefact `abc123`" in detail and "(medtpe mode)" in detail
    assert "8,100 → 5,800 prompt tokens (28.4% fewer)" in detail
    assert "resources 1,204, unmapped 3" in detail
    assert "2026-11-25T10:00:00Z" in detail and "earlier call" not in detail
    assert "not a diagnosis" in detail
    assert "earlier call" in card_text(score(0.83), BANDS, cached=True).detail


def test_without_a_probability_the_card_says_so_and_only_informs() -> None:
    text = card_text(score(None), BANDS, cached=False)
    assert text.indicator is Indicator.INFO
    assert "no risk score" in text.summary and "Risk band" not in text.detail


def test_a_summary_stays_under_140_characters_whatever_the_title() -> None:
    text = card_text(score(0.5, task_title="A very long task title " * 10), BANDS, cached=False)
    assert len(text.summary) < SUMMARY_LIMIT and text.summary.endswith("high risk (50%)")


def test_each_hook_services_a_registered_task_with_a_patient_record_prefetch() -> None:
    assert len({s.id for s in SERVICES}) == len(SERVICES)
    for service in SERVICES:
        get_task(service.task)
        assert service.hook in HOOK_CONTEXT
        assert service.prefetch["patient"] == "Patient/{{context.patientId}}"
        for query in service.prefetch.values():
            kind, _, params = query.partition("?")
            # the recommended subset: an instance read, or a search on the patient reference
            assert (
                not params and kind.count("/") == 1
            ) or params == "patient={{context.patientId}}"
    assert get_service("medtpe-icu-mortality-encounter-start").hook == "encounter-start"


def test_templates_take_root_level_primitive_context_fields_only() -> None:
    context = {"patientId": "12", "encounterId": 7, "medication": {"id": "m"}, "flag": True}
    assert render_template("Encounter/{{ context.encounterId }}", context) == "Encounter/7"
    for template in ("{{context.medication}}", "{{context.flag}}", "{{context.absent}}", "{{x}}"):
        with pytest.raises(TemplateError):
            render_template(template, context)


def events(*codes: str, value: float | None = None) -> SubjectEvents:
    return SubjectEvents.from_events(
        [
            MedsEvent(subject_id=1, time=datetime(2150, 1, 1, i), code=c, numeric_value=value)
            for i, c in enumerate(codes)
        ]
    )


def test_the_digest_changes_with_any_event_value_time_or_part() -> None:
    base = record_digest(events("A", "B"), None, "task", "artefact")
    assert base == record_digest(events("A", "B"), None, "task", "artefact")
    others = {
        record_digest(events("A", "B", "C"), None, "task", "artefact"),
        record_digest(events("A", "C"), None, "task", "artefact"),
        record_digest(events("A", "B", value=1.0), None, "task", "artefact"),
        record_digest(events("A", "B"), datetime(2150, 1, 2), "task", "artefact"),
        record_digest(events("A", "B"), None, "other-task", "artefact"),
        record_digest(events("A", "B"), None, "task", "other-artefact"),
    }
    assert base not in others and len(others) == 6
