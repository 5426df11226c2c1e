"""`medtpe monitor`: the monitoring report of the ledger's predictions over a period, per task:
the live predictions overall, by ISO week, by site, by site and week and by subgroup (each
cohort attribute's values); the threshold sweep; silent-mode predictions and shadow pairs apart.

Live: neither silent (`predictions.silent`) nor a shadow (`shadow_of`). Silent predictions were
recorded without a card shown; their figures are reported beside the live ones, never mixed in.
Shadow rows answer the same request another way (the original tokenizer); they are reported as
agreement and |Δp| with the row they shadow.

`write_report(engine, out)` writes `report.json` (every figure), `report.html` (the page, its plots
embedded) and `seismometer/` (`medtpe.monitoring.seismometer_export`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine

from medtpe.core.thresholds import Thresholds
from medtpe.monitoring.figures import (
    DEFAULT_RESAMPLES,
    Slicer,
    clean,
    iso_week,
    period_days,
    shadow_pairs,
    threshold_sweep,
    verdict,
)
from medtpe.monitoring.frame import Monitored, read_monitored
from medtpe.monitoring.horizons import HORIZON_TEXT
from medtpe.monitoring.html_page import render_html
from medtpe.monitoring.seismometer_export import write_seismometer

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
UNKNOWN = "(unknown)"
"""A subgroup's value where the attribute was not recorded for a prediction."""


@dataclass(frozen=True)
class ReportSettings:
    """The period, the thresholds and the bootstrap of a report."""

    since: datetime | None = None
    until: datetime | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 1


def flags(data: Monitored, thresholds: Thresholds) -> tuple[np.ndarray, np.ndarray]:
    """(each row's threshold, whether its p("yes") reaches it)."""
    cut = np.empty(len(data), dtype=float)
    for task in set(data.task):
        mine = data.task == task
        for site in set(data.site[mine]):
            cut[mine & (data.site == site)] = thresholds.of(task, site or None)
    with np.errstate(invalid="ignore"):
        return cut, np.nan_to_num(data.p_yes, nan=-1.0) >= cut


def _grouped(keys: np.ndarray, rows: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """`rows` grouped by their key, keys sorted."""
    values = keys[rows]
    return [(str(k), rows[values == k]) for k in sorted(set(values))]


def task_report(
    data: Monitored, task: str, weeks: np.ndarray, settings: ReportSettings
) -> dict[str, Any]:
    """The figures of one task (see the module docstring)."""
    cut, flagged = flags(data, settings.thresholds)
    slicer = Slicer(data, flagged, settings.resamples, settings.seed)
    mine = data.in_period & (data.task == task)
    is_shadow = data.shadow_of != ""
    live = np.flatnonzero(mine & ~data.silent & ~is_shadow)
    silent = np.flatnonzero(mine & data.silent & ~is_shadow)
    overall = slicer.figures(live)
    sites = np.where(data.site == "", "(none)", data.site)
    report: dict[str, Any] = {
        "task": task,
        "outcome": HORIZON_TEXT.get(task, "no outcome definition"),
        "thresholds": {
            "default": settings.thresholds.of(task),
            "by_site": {s: float(cut[r][0]) for s, r in _grouped(sites, live)},
        },
        "verdict": verdict(overall),
        "overall": overall,
        "by_week": [{"week": w, **slicer.figures(r)} for w, r in _grouped(weeks, live)],
        "by_site": [{"site": s, **slicer.figures(r)} for s, r in _grouped(sites, live)],
        "by_site_week": [
            {"site": s, "week": w, **slicer.figures(rw)}
            for s, r in _grouped(sites, live)
            for w, rw in _grouped(weeks, r)
        ],
        "by_subgroup": [
            {"attribute": name, "value": v, **slicer.figures(r)}
            for name in sorted(data.attributes)
            for v, r in _grouped(
                np.where(data.attributes[name] == "", UNKNOWN, data.attributes[name]), live
            )
        ],
        "threshold_sweep": threshold_sweep(
            data.p_yes[live],
            data.label[live],
            period_days(data.created_at[live], settings.since, settings.until),
        ),
        "silent": None,
        "shadow": shadow_pairs(data, np.flatnonzero(mine & is_shadow), weeks),
    }
    if len(silent):
        silent_overall = slicer.figures(silent)
        report["silent"] = {
            "verdict": verdict(silent_overall),
            "overall": silent_overall,
            "by_week": [{"week": w, **slicer.figures(r)} for w, r in _grouped(weeks, silent)],
        }
    return report


def build_report(engine: Engine, settings: ReportSettings) -> tuple[dict[str, Any], Monitored]:
    """The report's figures (JSON-ready) and the data they were computed on
    (`medtpe.monitoring.frame.read_monitored`: `PeriodTooLarge` past `MAX_REPORT_ROWS`
    predictions, `LedgerUnavailable`)."""
    data = read_monitored(engine, settings.since, settings.until)
    days, day_of_row = np.unique(data.created_at.astype("datetime64[D]"), return_inverse=True)
    weeks = np.array([iso_week(day) for day in days.tolist()], dtype=object)[day_of_row]
    tasks = sorted(set(data.task[data.in_period]))
    report = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "since": settings.since.isoformat() if settings.since else None,
        "until": settings.until.isoformat() if settings.until else None,
        "predictions": int(data.in_period.sum()),
        "resamples": settings.resamples,
        "tasks": [task_report(data, task, weeks, settings) for task in tasks],
    }
    return clean(report), data


def write_report(engine: Engine, out: Path, settings: ReportSettings) -> dict[str, Any]:
    """Write `report.json`, `report.html` and the seismometer export under `out`; the report."""
    out.mkdir(parents=True, exist_ok=True)
    report, data = build_report(engine, settings)
    (out / REPORT_JSON).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (out / REPORT_HTML).write_text(render_html(report), encoding="utf-8")
    write_seismometer(data, flags(data, settings.thresholds)[0], out / "seismometer")
    return report
