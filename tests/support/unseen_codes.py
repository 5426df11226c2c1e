"""Records of a site whose codes the artefact never saw (the drift tests' input)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta


def unseen_events(subject_id: int, n_events: int, seed: int = 0) -> list[dict]:
    """A record of a site whose codes the artefact never saw: local lab and order codes with
    values, no description in its codes metadata."""
    rng = random.Random(seed)
    start = datetime(2151, 6, 1, 8)
    events: list[dict] = [
        {"subject_id": subject_id, "time": None, "code": "GENDER//F"},
        {"subject_id": subject_id, "time": "2090-01-01T00:00:00", "code": "MEDS_BIRTH"},
    ]
    for i in range(n_events):
        code = f"SITEX_LOCAL//{rng.choice(['CHEM', 'HEME', 'ORD'])}//Z{rng.randint(10000, 99999)}"
        time = start + timedelta(minutes=7 * i)
        value = round(rng.uniform(0, 500), 2)
        events.append(
            {
                "subject_id": subject_id,
                "time": time.isoformat(),
                "code": code,
                "numeric_value": value,
            }
        )
    return events
