"""A small MEDS dataset whose ICU stays end in every way the outcome join must handle (written
with the project's MEDS fixture writer), and ledger predictions about it."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from tests.support.meds_fixtures import write_table

ADMITTED = datetime(2150, 3, 1, 8, 0)
AT_24H = ADMITTED + timedelta(hours=24)
"""The ICU mortality labeller's prediction time: 24 h after ICU admission."""


def _subject(
    subject: int, sex: str, born: datetime, events: list[tuple[datetime, str]]
) -> list[dict]:
    rows = [
        {"subject_id": subject, "time": None, "code": f"GENDER//{sex}"},
        {"subject_id": subject, "time": born, "code": "MEDS_BIRTH"},
        {"subject_id": subject, "time": ADMITTED, "code": "HOSPITAL_ADMISSION//EW EMER.//ER"},
        {"subject_id": subject, "time": ADMITTED, "code": "ICU_ADMISSION//MICU"},
        {
            "subject_id": subject,
            "time": ADMITTED + timedelta(hours=1),
            "code": "LAB//220045//bpm",
            "numeric_value": 80.0,
        },
    ]
    return rows + [{"subject_id": subject, "time": t, "code": c} for t, c in events]


def outcome_subjects(open_stay_closes: bool = False) -> list[dict]:
    """Subject 1 dies in the ICU (positive), 2 leaves alive (negative), 3 is still in the ICU
    (open; `open_stay_closes`: discharged alive on day 5), 4 leaves after 10 h (no label at 24 h),
    5 leaves alive and is a 30-year-old man, the others are women born in 2080 (age band 65-79)."""
    old = datetime(2080, 1, 1)
    rows = _subject(
        1,
        "F",
        old,
        [
            (ADMITTED + timedelta(days=3), "MEDS_DEATH"),
            (ADMITTED + timedelta(days=3), "ICU_DISCHARGE//MICU"),
        ],
    )
    rows += _subject(2, "F", old, [(ADMITTED + timedelta(days=2), "ICU_DISCHARGE//MICU")])
    third = [(ADMITTED + timedelta(days=5), "ICU_DISCHARGE//MICU")] if open_stay_closes else []
    rows += _subject(3, "F", old, third)
    rows += _subject(4, "F", old, [(ADMITTED + timedelta(hours=10), "ICU_DISCHARGE//MICU")])
    rows += _subject(
        5, "M", datetime(2120, 6, 1), [(ADMITTED + timedelta(days=4), "ICU_DISCHARGE//MICU")]
    )
    return rows


def write_outcome_dataset(root: Path, open_stay_closes: bool = False) -> Path:
    """The dataset of `outcome_subjects` (one data shard)."""
    write_table(root / "data" / "train" / "0.parquet", outcome_subjects(open_stay_closes))
    return root
