"""Ledger rows for the monitoring tests, made through the ledger's own API: signed receipts
(`tests.support.ledger_rows`) with chosen task, time, subject, site and p("yes")."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from medtpe.ledger.feedback import FeedbackRow, record_feedback
from medtpe.ledger.outcomes import OutcomeRow, record_outcomes
from medtpe.ledger.receipt import utc_text
from medtpe.ledger.store import Ledger, PredictionRow
from medtpe.monitoring.figures import iso_week
from tests.support.ledger_rows import SIGNER, receipt


def prediction(
    index: int,
    *,
    created_at: datetime,
    subject_id: str,
    prediction_time: datetime | None,
    p_yes: float | None,
    task: str = "icu_mortality",
    site: str | None = "tenant-a",
    latency_ms: float = 100.0,
    silent: bool = False,
    shadow_of: str | None = None,
    door: str = "predict",
) -> PredictionRow:
    """One signed ledger row (its id from `index`)."""
    answer = None if p_yes is None else ("yes" if p_yes >= 0.5 else "no")
    signed = receipt(
        index,
        prediction_id=str(uuid.UUID(int=index + 1, version=4)),
        created_at=utc_text(created_at),
        task=task,
        answer=answer,
        p_yes=p_yes,
        subject_id=subject_id,
        prediction_time=None if prediction_time is None else utc_text(prediction_time),
        door=door,
        caller="key:monitor-test",
        site=site,
        silent=silent,
    )
    return PredictionRow.signed(
        signed,
        SIGNER,
        format_ok=p_yes is not None,
        original_tokens=2_000,
        medtpe_tokens=1_000,
        compression_rate=0.5,
        latency_ms=latency_ms,
        shadow_of=shadow_of,
    )


START = datetime(2026, 9, 7, 0, 0, tzinfo=UTC)  # a Monday: ISO week 2026-W37
N = 400
SITES = ("a", "b", None)


def sqlite_url(folder: Path) -> str:
    """A SQLite ledger's URL in `folder`."""
    return f"sqlite:///{folder / 'ledger.sqlite3'}"


def populated_ledger(url: str, informative: bool = True) -> tuple[Ledger, dict[str, np.ndarray]]:
    """The ledger at `url` given N live rows over 3 weeks and 3 sites (120 subjects), 20 silent,
    10 shadows of live rows; outcomes known for 4 in 5 (drawn from p when `informative`, else at
    random), sex recorded, 40 feedback cards; and what the rows hold, as arrays."""
    rng = np.random.default_rng(7)
    ledger = Ledger.open(url)
    p = rng.uniform(0.02, 0.98, N + 20)
    rows = [
        prediction(
            i,
            created_at=START + timedelta(hours=1.2 * i),
            subject_id=str(i % 120),
            prediction_time=datetime(2150, 1, 1) + timedelta(hours=i),
            p_yes=float(p[i]),
            site=SITES[i % 3],
            latency_ms=float(50 + i % 97),
            silent=i >= N,
        )
        for i in range(N + 20)
    ]
    shadows = [
        prediction(
            1000 + k,
            created_at=rows[k * 7].created_at + timedelta(seconds=1),
            subject_id=rows[k * 7].subject_id,
            prediction_time=rows[k * 7].prediction_time,
            p_yes=float(np.clip(p[k * 7] + (0.3 if k % 2 else 0.01), 0, 1)),
            site=rows[k * 7].site,
            shadow_of=rows[k * 7].prediction_id,
        )
        for k in range(10)
    ]
    ledger.record(rows + shadows)
    drawn = rng.uniform(size=N + 20) < (p if informative else 0.3)
    joined = [
        OutcomeRow(
            r.prediction_id,
            "known" if i % 5 else "open",
            bool(drawn[i]) if i % 5 else None,
            None,
            {"sex": "female" if i % 2 else "male"},
        )
        for i, r in enumerate(rows)
    ]
    record_outcomes(ledger, joined, source="test", data_end=None, joined_at=START)
    record_feedback(
        ledger,
        [
            FeedbackRow(
                card_uuid=f"card-{i}",
                prediction_id=rows[i].prediction_id,
                issuer="https://ehr.example",
                outcome="overridden" if i % 2 else "accepted",
                override_reason="not-relevant" if i % 4 == 1 else None,
                outcome_time=START.replace(tzinfo=None),
                received_at=START.replace(tzinfo=None),
            )
            for i in range(40)
        ],
    )
    truth = {
        "p": p[:N],
        "known": np.array([i % 5 != 0 for i in range(N)]),
        "label": drawn[:N],
        "site": np.array([SITES[i % 3] or "" for i in range(N)], dtype=object),
        "subject": np.array([str(i % 120) for i in range(N)]),
        "latency": np.array([50 + i % 97 for i in range(N)], dtype=float),
        "sex": np.array(["female" if i % 2 else "male" for i in range(N)]),
        "week": np.array([iso_week(START + timedelta(hours=1.2 * i)) for i in range(N)]),
    }
    return ledger, truth
