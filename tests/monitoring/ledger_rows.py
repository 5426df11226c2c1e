"""Ledger rows for the monitoring tests, made through the ledger's own API: signed receipts
(`tests.ledger.rows`) with chosen task, time, subject, site and p("yes")."""

from __future__ import annotations

import uuid
from datetime import datetime

from ledger.receipt import utc_text
from ledger.store import PredictionRow
from tests.ledger.rows import SIGNER, receipt


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
    )
    return PredictionRow.signed(
        signed,
        SIGNER,
        door=door,
        caller="key:monitor-test",
        site=site,
        subject_id=subject_id,
        prediction_time=prediction_time,
        format_ok=p_yes is not None,
        original_tokens=2_000,
        medtpe_tokens=1_000,
        compression_rate=0.5,
        latency_ms=latency_ms,
        silent=silent,
        shadow_of=shadow_of,
    )
