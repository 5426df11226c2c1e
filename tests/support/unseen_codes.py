"""The drift tests' material: records of a site whose codes the artefact never saw, and the drift
counters the service exports for what it answers."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from tests.support.service_support import meds_event, metric_value

DRIFT_COUNTERS: dict[str, tuple[str, dict[str, str]]] = {
    "medtpe_drift_events_total": ("medtpe_drift_events_total", {}),
    "medtpe_drift_events_dropped_total": ("medtpe_drift_events_dropped_total", {}),
    "medtpe_drift_events_undescribed_total": ("medtpe_drift_events_undescribed_total", {}),
    "medtpe_drift_merged_tokens_total": ("medtpe_drift_merged_tokens_total", {}),
    "original": ("medtpe_drift_prompt_tokens_total", {"tokenizer": "original"}),
    "medtpe": ("medtpe_drift_prompt_tokens_total", {"tokenizer": "medtpe"}),
}
"""The drift counters by key (the prompt tokens' by tokenizer): metric name and extra labels."""
BUILD_GAUGE = "medtpe_artefact_build_compression_rate"
"""The artefact's build compression rate, which the drift alerts and panels compare against."""


def unseen_events(subject_id: int, n_events: int, seed: int = 0) -> list[dict]:
    """A record of a site whose codes the artefact never saw: local lab and order codes with
    values, no description in its codes metadata."""
    rng = random.Random(seed)
    start = datetime(2151, 6, 1, 8)
    events = [
        meds_event(subject_id, None, "GENDER//F"),
        meds_event(subject_id, datetime(2090, 1, 1), "MEDS_BIRTH"),
    ]
    for i in range(n_events):
        code = f"SITEX_LOCAL//{rng.choice(['CHEM', 'HEME', 'ORD'])}//Z{rng.randint(10000, 99999)}"
        time = start + timedelta(minutes=7 * i)
        events.append(meds_event(subject_id, time, code, round(rng.uniform(0, 500), 2)))
    return events


def drift_metrics(metrics: str, task: str, site: str) -> dict[str, float]:
    """The drift counters of `task` at `site` in the /metrics text `metrics` by `DRIFT_COUNTERS`
    key, and the artefact's build compression rate (`build`)."""
    values = {
        key: metric_value(metrics, name, task=task, site=site, **labels)
        for key, (name, labels) in DRIFT_COUNTERS.items()
    }
    return values | {"build": metric_value(metrics, BUILD_GAUGE)}
