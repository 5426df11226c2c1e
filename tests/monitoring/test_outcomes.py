"""`medtpe.monitoring.outcomes`: ledger predictions (made through the ledger's API) labelled from a
small MEDS dataset by the task's own labeller at its horizon, with their cohort attributes; open
outcomes counted and closed by a later join; nothing duplicated; on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from medtpe.core.meds.readers import MedsDataset
from medtpe.core.tasks import get_task
from medtpe.ledger.schema import Attribute, Outcome
from medtpe.ledger.store import Ledger
from medtpe.monitoring.cohort import AttributeMapError, age_band, parse_attribute_map
from medtpe.monitoring.outcomes import MedsSource, join_outcomes
from tests.support.meds_outcomes import ADMITTED, AT_24H, write_outcome_dataset
from tests.support.monitoring_rows import prediction

TASK = get_task("icu_mortality")
MADE = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
ADMISSION_TYPE = parse_attribute_map(
    {
        "admission_type": {
            "HOSPITAL_ADMISSION//EW EMER.*": "emergency",
            "HOSPITAL_ADMISSION//ELECTIVE*": "elective",
        }
    }
)


def _predictions(ledger: Ledger) -> dict[str, str]:
    """One prediction per subject 1-5 at 24 h (subject 4 at 9 h: its stay ends at 10 h), one
    for subject 77 (not in the data), one without a prediction time; {name: prediction id}."""
    times = {1: AT_24H, 2: AT_24H, 3: AT_24H, 4: ADMITTED + timedelta(hours=9), 5: AT_24H}
    rows = [
        prediction(s, created_at=MADE, subject_id=str(s), prediction_time=t, p_yes=0.3)
        for s, t in times.items()
    ]
    rows.append(prediction(77, created_at=MADE, subject_id="77", prediction_time=AT_24H, p_yes=0.5))
    rows.append(prediction(78, created_at=MADE, subject_id="1", prediction_time=None, p_yes=0.5))
    ledger.record(rows)
    names = [*(f"subject{s}" for s in times), "absent", "untimed"]
    return dict(zip(names, (r.prediction_id for r in rows), strict=True))


def _stored(ledger: Ledger) -> tuple[dict[str, tuple], dict[str, dict[str, str]]]:
    with ledger.engine.connect() as connection:
        outcomes = {
            r.prediction_id: (r.status, r.label, r.horizon_end)
            for r in connection.execute(select(Outcome.__table__))
        }
        attributes: dict[str, dict[str, str]] = {}
        for r in connection.execute(select(Attribute.__table__)):
            attributes.setdefault(r.prediction_id, {})[r.name] = r.value
    return outcomes, attributes


def _naive(when: datetime | None) -> datetime | None:
    return None if when is None else when.replace(tzinfo=None)


def test_outcomes_join_label_count_and_update(ledger_url: str, tmp_path: Path) -> None:
    ledger = Ledger.open(ledger_url)
    ids = _predictions(ledger)
    source = MedsSource(MedsDataset.load(write_outcome_dataset(tmp_path / "v1")), "meds:v1")

    counts = join_outcomes(ledger, TASK, source, ADMISSION_TYPE)

    assert counts.as_dict() == {
        "predictions": 7,
        "statuses": {"known": 3, "no_label": 2, "not_in_data": 1, "open": 1},
        "positives": 1,
        "attributes": 15,
    }
    outcomes, attributes = _stored(ledger)
    assert {k: (s, lab) for k, (s, lab, _) in outcomes.items()} == {
        ids["subject1"]: ("known", True),
        ids["subject2"]: ("known", False),
        ids["subject3"]: ("open", None),
        ids["subject4"]: ("no_label", None),
        ids["subject5"]: ("known", False),
        ids["untimed"]: ("no_label", None),
    }
    assert _naive(outcomes[ids["subject1"]][2]) == ADMITTED + timedelta(days=3)
    assert _naive(outcomes[ids["subject4"]][2]) == ADMITTED + timedelta(hours=10)
    assert outcomes[ids["subject3"]][2] is None  # the stay is still open
    assert attributes[ids["subject1"]] == {
        "sex": "female",
        "age_band": "65-79",
        "admission_type": "emergency",
    }
    assert attributes[ids["subject5"]] == {
        "sex": "male",
        "age_band": "18-44",
        "admission_type": "emergency",
    }
    assert ids["untimed"] not in attributes and ids["absent"] not in attributes

    # the same join again joins only what is not known yet: the open stay and the subject the
    # data do not hold; nothing duplicated; later data close the open stay
    assert join_outcomes(ledger, TASK, source, ADMISSION_TYPE).as_dict() == {
        "predictions": 2,
        "statuses": {"not_in_data": 1, "open": 1},
        "positives": 0,
        "attributes": 3,
    }
    later = MedsSource(MedsDataset.load(write_outcome_dataset(tmp_path / "v2", True)), "meds:v2")
    again = join_outcomes(ledger, TASK, later, ADMISSION_TYPE)
    assert again.statuses == {"known": 1, "not_in_data": 1}
    assert join_outcomes(ledger, TASK, later, ADMISSION_TYPE).statuses == {"not_in_data": 1}
    outcomes, attributes = _stored(ledger)
    assert outcomes[ids["subject3"]][:2] == ("known", False)
    with ledger.engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(Outcome)).scalar() == 6
        assert connection.execute(select(func.count()).select_from(Attribute)).scalar() == 15
    ledger.close()


def test_a_horizon_past_the_data_end_stays_open(tmp_path: Path) -> None:
    """A readmission prediction whose 30 days run past the data's last event stays open, though
    the labeller (which does not censor) would call it negative."""
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    discharge = ADMITTED + timedelta(days=2)
    ledger.record(
        [
            prediction(
                0,
                created_at=MADE,
                subject_id="2",
                prediction_time=discharge,
                p_yes=0.2,
                task="readmission_30d",
            ),
        ]
    )
    dataset = tmp_path / "meds"
    write_outcome_dataset(dataset)
    # subject 2's ICU discharge is no hospital discharge: no readmission label at all
    counts = join_outcomes(
        ledger, get_task("readmission_30d"), MedsSource(MedsDataset.load(dataset), "m")
    )
    assert counts.statuses == {"open": 1}
    ledger.close()


def test_tasks_without_a_horizon_are_refused(tmp_path: Path) -> None:
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    source = MedsSource(MedsDataset.load(write_outcome_dataset(tmp_path / "m")), "m")
    with pytest.raises(ValueError, match="phenotyping"):
        join_outcomes(ledger, get_task("phenotyping"), source)
    ledger.close()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (["not", "a", "map"], "expected a mapping"),
        ({"bad name!": {"X": "y"}}, "not a plain name"),
        ({"race": "WHITE"}, "expected a mapping of codes"),
        ({"race": {"*": "all"}}, "is not a code"),
        ({"age_band": {"X": "y"}}, "computed from the birth date"),
        ({"race": {"RACE//X": ["a"]}}, "is not text"),
    ],
)
def test_attribute_map_errors_name_the_entry(data: object, message: str) -> None:
    with pytest.raises(AttributeMapError, match=message):
        parse_attribute_map(data)


@pytest.mark.parametrize(
    ("born", "when", "band"),
    [
        (datetime(2000, 6, 2), datetime(2018, 6, 1), "<18"),
        (datetime(2000, 6, 1), datetime(2018, 6, 1), "18-44"),
        (datetime(1950, 1, 1), datetime(2015, 1, 1), "65-79"),
        (datetime(1900, 1, 1), datetime(2015, 1, 1), "80+"),
    ],
)
def test_age_bands(born: datetime, when: datetime, band: str) -> None:
    assert age_band(born, when) == band
