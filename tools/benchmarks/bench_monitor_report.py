"""`medtpe monitor`'s report on a ledger of 10,000 predictions (signed rows recorded through the
ledger's API on SQLite; 12 weeks, 3 sites, 2,000 patients, 5% silent, 2% shadows, 4 in 5
outcomes known, sex, age band and one mapped attribute, 500 feedback cards): the time of the
whole report (read, figures with 200 bootstrap resamples each, HTML with its plots, JSON,
seismometer export), and of its parts. Target: ≤ 30 s on the 2-core development machine.

    .venv/bin/python -m tools.benchmarks.bench_monitor_report \\
        --out tools/benchmarks/results/monitor_report.json
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from medtpe.ledger.feedback import FeedbackRow, record_feedback
from medtpe.ledger.outcomes import OutcomeRow, record_outcomes
from medtpe.ledger.receipt import (
    Receipt,
    prompt_ids_digest,
    rendering_digest,
    rendering_settings,
    utc_text,
)
from medtpe.ledger.signing import Signer
from medtpe.ledger.store import Ledger, PredictionRow
from medtpe.monitoring.figures import DEFAULT_RESAMPLES
from medtpe.monitoring.html_page import render_html
from medtpe.monitoring.report import ReportSettings, build_report, write_report
from tools.benchmarks.results_file import write_results

ROWS = 10_000
TARGET_S = 30.0
START = datetime(2026, 8, 3, tzinfo=UTC)
RENDERING = rendering_settings(1, "b" * 64, 4096, "sliding", 24)


def _row(
    signer: Signer,
    index: int,
    p: float,
    *,
    site: str,
    subject_id: str,
    latency_ms: float,
    silent: bool = False,
    shadow_of: str | None = None,
) -> PredictionRow:
    receipt = Receipt(
        prediction_id=str(uuid.UUID(int=index + 1, version=4)),
        created_at=utc_text(START + timedelta(minutes=12 * index)),
        task="icu_mortality",
        record_sha256="c" * 64,
        prompt_ids_sha256=prompt_ids_digest(range(index, index + 50)),
        artefact_digest="a" * 64,
        rendering=RENDERING,
        rendering_digest=rendering_digest(RENDERING),
        model="smollm2-135m-instruct",
        mode="medtpe",
        dtype="float32",
        decoding={"max_new_tokens": 8, "temperature": 0.0},
        engine_version="bench",
        product_version="0.1.0",
        answer="yes" if p >= 0.5 else "no",
        p_yes=p,
        subject_id=subject_id,
        prediction_time=utc_text(datetime(2150, 1, 1) + timedelta(hours=index)),
        door="cds_hook",
        caller="key:bench",
        site=site,
        silent=silent,
    )
    return PredictionRow.signed(
        receipt,
        signer,
        format_ok=True,
        original_tokens=3000,
        medtpe_tokens=1500,
        compression_rate=0.5,
        latency_ms=latency_ms,
        shadow_of=shadow_of,
    )


def populate(ledger: Ledger, rows: int, seed: int = 3) -> None:
    """`rows` predictions with outcomes, attributes and feedback (see the module docstring)."""
    rng = np.random.default_rng(seed)
    signer = Signer(Ed25519PrivateKey.generate())
    p = rng.beta(2, 5, rows)
    live = [
        _row(
            signer,
            i,
            float(p[i]),
            site=("north", "south", "east")[i % 3],
            subject_id=str(i % 2000),
            latency_ms=float(rng.gamma(4, 60)),
            silent=bool(i % 20 == 0),
        )
        for i in range(rows - rows // 50)
    ]
    shadows = [
        _row(
            signer,
            rows + k,
            float(np.clip(p[k * 40] + rng.normal(0, 0.05), 0, 1)),
            site=live[k * 40].site,
            subject_id=live[k * 40].subject_id,
            latency_ms=300.0,
            shadow_of=live[k * 40].prediction_id,
        )
        for k in range(rows // 50)
    ]
    ledger.record(live + shadows)
    happened = rng.uniform(size=len(live)) < p[: len(live)] * 0.6
    bands = ("18-44", "45-64", "65-79", "80+")
    joined = [
        OutcomeRow(
            r.prediction_id,
            "known" if i % 5 else "open",
            bool(happened[i]) if i % 5 else None,
            None,
            {
                "sex": ("female", "male")[i % 2],
                "age_band": bands[(i // 7) % 4],
                "admission_type": ("emergency", "elective", "urgent")[(i // 3) % 3],
            },
        )
        for i, r in enumerate(live)
    ]
    record_outcomes(ledger, joined, source="bench", data_end=None, joined_at=START)
    record_feedback(
        ledger,
        [
            FeedbackRow(
                card_uuid=str(uuid.UUID(int=i + 1)),
                prediction_id=live[i * 19].prediction_id,
                issuer="https://ehr.example",
                outcome="overridden" if i % 3 else "accepted",
                override_reason=("not-relevant", "already-treated", None)[i % 3],
                outcome_time=START.replace(tzinfo=None),
                received_at=START.replace(tzinfo=None),
            )
            for i in range(500)
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        ledger = Ledger.open(f"sqlite:///{Path(work) / 'ledger.sqlite3'}")
        start = time.perf_counter()
        populate(ledger, args.rows)
        populate_s = time.perf_counter() - start
        settings = ReportSettings(resamples=args.resamples)
        start = time.perf_counter()
        report = write_report(ledger.engine, Path(work) / "report", settings)
        report_s = time.perf_counter() - start
        start = time.perf_counter()
        figures, _ = build_report(ledger.engine, settings)
        figures_s = time.perf_counter() - start
        start = time.perf_counter()
        render_html(figures)
        html_s = time.perf_counter() - start
        ledger.close()
    (task,) = report["tasks"]
    results = {
        "rows": args.rows,
        "resamples": args.resamples,
        "populate_s": round(populate_s, 2),
        "report_s": round(report_s, 2),
        "figures_s": round(figures_s, 2),
        "html_s": round(html_s, 2),
        "target_s": TARGET_S,
        "met": report_s <= TARGET_S,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "slices": 1
        + sum(len(task[k]) for k in ("by_week", "by_site", "by_site_week", "by_subgroup")),
        "live": task["overall"]["n"],
        "verdict": task["verdict"],
    }
    print(results)
    write_results(args.out, "python -m tools.benchmarks.bench_monitor_report", results)


if __name__ == "__main__":
    main()
