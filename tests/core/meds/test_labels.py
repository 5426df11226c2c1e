"""Label files of the four tasks from hand-built MEDS events (every row checked by hand), the
phenotype code lists, `medtpe labels` and the ACES configuration of ICU mortality."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import meds
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from medtpe.cli.labels_commands import labels
from medtpe.core.meds import MedsDataset, read_labels
from medtpe.core.meds.labels import derive_labels, label_table
from medtpe.core.meds.labels.phenotypes import phenotype_map
from medtpe.core.tasks import get_task
from tests.support.meds_fixtures import write_table
from tests.support.paths import ROOT

DAY0 = datetime(2150, 1, 1)


def at(days: float, hours: float = 0) -> datetime:
    return DAY0 + timedelta(days=days, hours=hours)


def stays_rows() -> list[dict]:
    """Subject 1: three hospital stays (an unplanned readmission after the first, pancreatic
    cancer coded at the third's discharge), one ICU stay; subject 2: a short and a fatal ICU
    stay in one hospital stay."""
    events = {
        1: [
            (None, "GENDER//F"),
            (at(0, 8), "HOSPITAL_ADMISSION//EW EMER.//EMERGENCY ROOM"),
            (at(0, 10), "ICU_ADMISSION//Medical Intensive Care Unit (MICU)"),
            (at(3, 10), "ICU_DISCHARGE//Medical Intensive Care Unit (MICU)"),
            (at(5, 12), "HOSPITAL_DISCHARGE//HOME"),
            (at(5, 12), "DIAGNOSIS//ICD//9//4019"),  # essential hypertension
            (at(5, 12), "DIAGNOSIS//ICD//10//J189"),  # pneumonia, through the GEMs
            (at(20), "HOSPITAL_ADMISSION//URGENT//PHYSICIAN REFERRAL"),
            (at(22), "HOSPITAL_DISCHARGE//HOME"),
            (at(100), "HOSPITAL_ADMISSION//ELECTIVE//PHYSICIAN REFERRAL"),
            (at(102), "HOSPITAL_DISCHARGE//HOME"),
            (at(102), "DIAGNOSIS//ICD//10//C250"),  # malignant neoplasm of the pancreas head
            (at(800), "LAB//220045//bpm"),  # follow-up beyond a year
        ],
        2: [
            (at(0), "HOSPITAL_ADMISSION//EW EMER.//EMERGENCY ROOM"),
            (at(0, 12), "ICU_ADMISSION//Surgical Intensive Care Unit (SICU)"),
            (at(1), "ICU_DISCHARGE//Surgical Intensive Care Unit (SICU)"),  # 12 h: no row
            (at(2), "ICU_ADMISSION//Surgical Intensive Care Unit (SICU)"),
            (at(4), meds.death_code),
            (at(4), "ICU_DISCHARGE//Surgical Intensive Care Unit (SICU)"),
            (at(4), "HOSPITAL_DISCHARGE//DIED"),
            (at(4), "DIAGNOSIS//ICD//9//0389"),  # septicemia
            (at(4), "DIAGNOSIS//ICD//9//78552"),  # septic shock
        ],
    }
    return [
        {"subject_id": subject, "time": time, "code": code}
        for subject, rows in events.items()
        for time, code in rows
    ]


@pytest.fixture(scope="module")
def stays_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stays")
    write_table(root / "data" / "0.parquet", stays_rows()[::-1])  # unsorted on purpose
    return root


@pytest.fixture(scope="module")
def dataset(stays_dir: Path) -> MedsDataset:
    return MedsDataset.load(stays_dir)


def rows_of(dataset: MedsDataset, task: str) -> list[tuple[int, datetime, object]]:
    return [
        (r.subject_id, r.prediction_time, r.label) for r in derive_labels(dataset, get_task(task))
    ]


def test_icu_mortality(dataset: MedsDataset) -> None:
    # subject 2's first stay ends before 24 h: no prediction; its second ends with death
    assert rows_of(dataset, "icu_mortality") == [(1, at(1, 10), False), (2, at(3), True)]


def test_phenotyping_from_icd9_and_icd10_codes(dataset: MedsDataset) -> None:
    assert rows_of(dataset, "phenotyping") == [
        (
            1,
            at(3, 10),  # the ICU discharge
            "Essential hypertension|Pneumonia (except that caused by tuberculosis or sexually "
            "transmitted disease)",
        ),
        (2, at(1), "Septicemia (except in labor)|Shock"),
        # diagnoses coded at the ICU discharge: predicted one second before them
        (2, at(4) - timedelta(seconds=1), "Septicemia (except in labor)|Shock"),
    ]
    task = get_task("phenotyping")
    assert task.parse_label(rows_of(dataset, "phenotyping")[1][2]) == [
        "Septicemia (except in labor)",
        "Shock",
    ]


def test_readmission_counts_unplanned_admissions_within_30_days(dataset: MedsDataset) -> None:
    # subject 1: day 5 -> urgent admission on day 20; day 22 -> elective on day 100; day 102
    # -> none; subject 2 died in hospital: no prediction
    assert rows_of(dataset, "readmission_30d") == [
        (1, at(5, 12), True),
        (1, at(22), False),
        (1, at(102), False),
    ]


def test_pancreatic_cancer_excludes_patients_diagnosed_before(dataset: MedsDataset) -> None:
    # subject 1 is coded on day 102: positive from days 5 and 22, left out from day 102 on;
    # subject 2 died within the year: an observed negative
    assert rows_of(dataset, "pancreatic_cancer_1y") == [
        (1, at(5, 12), True),
        (1, at(22), True),
        (2, at(4), False),
    ]


def test_no_label_is_recorded_at_or_before_its_prediction_time(dataset: MedsDataset) -> None:
    # the inclusive rendering (data up to and including the prediction time) must not show the
    # diagnoses a phenotype label is made of (in this fixture, no diagnosis precedes an ICU stay)
    for subject, when, _ in rows_of(dataset, "phenotyping"):
        shown = dataset.events(subject).before(when).codes
        assert not [code for code in shown if code.startswith("DIAGNOSIS//")], (subject, when)


def test_phenotype_code_lists() -> None:
    mapping = phenotype_map()
    task = get_task("phenotyping")
    assert {p for names in mapping.values() for p in names} == set(task.labels)
    assert mapping[("9", "4019")] == {"Essential hypertension"}
    # I10's GEM targets are 401.0, 401.1, 401.9; only 401.0 is "with complications" in CCS
    assert mapping[("10", "I10")] == {"Essential hypertension"}
    assert mapping[("10", "A419")] == {"Septicemia (except in labor)"}
    assert ("10", "C250") not in mapping


def test_label_table_follows_the_meds_label_schema(dataset: MedsDataset) -> None:
    binary = label_table(
        derive_labels(dataset, get_task("icu_mortality")), get_task("icu_mortality")
    )
    assert (
        binary.schema.field(meds.LabelSchema.boolean_value_name).type
        == meds.LabelSchema.boolean_value_dtype
    )
    multi = label_table(derive_labels(dataset, get_task("phenotyping")), get_task("phenotyping"))
    assert meds.LabelSchema.categorical_value_name in multi.column_names


def test_labels_command_writes_a_label_file(stays_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "readmission.parquet"
    result = CliRunner().invoke(
        labels, ["--meds", str(stays_dir), "--task", "readmission_30d", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "3 label rows (dataset MEDS version: not declared)" in result.output
    assert [r.label for r in read_labels(out)] == [True, False, False]
    unknown = CliRunner().invoke(
        labels, ["--meds", str(stays_dir), "--task", "nope", "--out", str(out)]
    )
    assert unknown.exit_code == 2 and "--task" in unknown.output
    neither = CliRunner().invoke(labels, ["--meds", str(stays_dir), "--out", str(out)])
    assert neither.exit_code == 2 and "exactly one" in neither.output


def test_aces_configuration_gives_the_same_icu_mortality_labels(
    stays_dir: Path, dataset: MedsDataset, tmp_path: Path
) -> None:
    pytest.importorskip("aces", reason="es-aces (the labels extra) is not installed")
    config = ROOT / "medtpe/core/meds/labels/aces/icu_mortality.yaml"
    out = tmp_path / "aces.parquet"
    result = CliRunner().invoke(
        labels, ["--meds", str(stays_dir), "--aces-config", str(config), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    aces = [(r.subject_id, r.prediction_time, r.label) for r in read_labels(out)]
    assert aces == rows_of(dataset, "icu_mortality")
    assert pq.read_schema(out).names[:2] == ["subject_id", "prediction_time"]
