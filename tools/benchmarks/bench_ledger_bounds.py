"""The ledger's bounds in memory and in time, on SQLite ledgers of synthetic rows (inserted
directly: the report and the outcomes' writes read no signature).

`report`: the peak RSS of `medtpe monitor`'s report (`write_report`: read, figures with 200
bootstrap resamples, HTML, JSON, seismometer export) at several sizes, each in a fresh process;
rows spread over 365 days, 3 sites, one patient per 5 predictions, 5 % silent, 2 % shadows, 4 in
5 outcomes known, 3 attributes each. The peak grows linearly with rows: the slope is the bytes a
row costs, and the line extrapolated to a year of a 10,000-a-day site (3.65 M rows) is compared
with the target, 2 GB (`MAX_REPORT_ROWS` bounds what one report may read).

`outcomes`: `record_outcomes` of 20,000 outcomes (3 attributes each) while another connection
writes one prediction row every 20 ms, as the service does: the longest delay of those writes,
with the outcomes committed `CHUNK` rows a transaction against all in one (as before). Target:
a concurrent write delayed by at most 1 s.

    .venv/bin/python -m tools.benchmarks.bench_ledger_bounds \\
        --out tools/benchmarks/results/ledger_bounds.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import insert

from medtpe.ledger import outcomes as ledger_outcomes
from medtpe.ledger.outcomes import OutcomeRow, record_outcomes
from medtpe.ledger.schema import Attribute, Outcome, Prediction
from medtpe.ledger.store import Ledger
from tools.benchmarks.results_file import write_results

SIZES = (25_000, 100_000, 400_000)
YEAR_ROWS = 3_650_000
REPORT_TARGET_BYTES = 2 * 10**9
OUTCOMES = 20_000
WRITE_EVERY_S = 0.02
DELAY_TARGET_S = 1.0
START = datetime(2026, 1, 1)
BATCH = 20_000


def _prediction(i: int, rows: int, p: float) -> dict[str, Any]:
    shadow = i % 50 == 49
    return {
        "prediction_id": str(uuid.UUID(int=i + 1, version=4)),
        "created_at": START + timedelta(days=365 * i / rows),
        "door": "cds_hook",
        "caller": "key:bench",
        "site": ("north", "south", "east")[i % 3],
        "task": "icu_mortality",
        "subject_id": str(i % max(1, rows // 5)),
        "prediction_time": datetime(2150, 1, 1) + timedelta(hours=i),
        "answer": '"yes"' if p >= 0.5 else '"no"',
        "p_yes": p,
        "format_ok": True,
        "original_tokens": 3000,
        "medtpe_tokens": 1500,
        "compression_rate": 0.5,
        "latency_ms": 200.0 + i % 97,
        "mode": "medtpe",
        "silent": i % 20 == 0,
        "shadow_of": str(uuid.UUID(int=i, version=4)) if shadow else None,
        "receipt": "{}",
        "signature": "bench",
        "key_id": "bench",
    }


def populate(ledger: Ledger, rows: int, seed: int = 3) -> None:
    """`rows` predictions with outcomes and attributes (see the module docstring)."""
    rng = np.random.default_rng(seed)
    bands = ("18-44", "45-64", "65-79", "80+")
    for first in range(0, rows, BATCH):
        ids = range(first, min(rows, first + BATCH))
        p = rng.beta(2, 5, len(ids))
        happened = rng.uniform(size=len(ids)) < p * 0.6
        predictions = [_prediction(i, rows, float(p[k])) for k, i in enumerate(ids)]
        outcomes = [
            {
                "prediction_id": row["prediction_id"],
                "status": "known" if i % 5 else "open",
                "label": bool(happened[k]) if i % 5 else None,
                "source": "bench",
                "joined_at": START,
            }
            for k, (i, row) in enumerate(zip(ids, predictions, strict=True))
        ]
        attributes = [
            {"prediction_id": row["prediction_id"], "name": name, "value": value}
            for i, row in zip(ids, predictions, strict=True)
            for name, value in (
                ("sex", ("female", "male")[i % 2]),
                ("age_band", bands[(i // 7) % 4]),
                ("admission_type", ("emergency", "elective", "urgent")[(i // 3) % 3]),
            )
        ]
        with ledger.engine.begin() as connection:
            connection.execute(insert(Prediction.__table__), predictions)
            connection.execute(insert(Outcome.__table__), outcomes)
            connection.execute(insert(Attribute.__table__), attributes)


def report_peak(url: str, out: Path) -> dict[str, Any]:
    """In this process: the report of the ledger at `url`; its time and the peak RSS."""
    from medtpe.monitoring.report import ReportSettings, write_report

    ledger = Ledger.open(url)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    report = write_report(ledger.engine, out, ReportSettings())
    ledger.close()
    return {
        "report_s": round(time.perf_counter() - start, 1),
        "rss_before_report_bytes": before,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "predictions": report["predictions"],
    }


def measure_report(sizes: tuple[int, ...], work: Path) -> dict[str, Any]:
    """The report's peak RSS at each size (a fresh process each), and the line through them."""
    runs = []
    for rows in sizes:
        url = f"sqlite:///{work / f'ledger-{rows}.sqlite3'}"
        ledger = Ledger.open(url)
        populate(ledger, rows)
        ledger.close()
        code = (
            "import json, sys; from pathlib import Path; "
            "from tools.benchmarks.bench_ledger_bounds import report_peak; "
            "print(json.dumps(report_peak(sys.argv[1], Path(sys.argv[2]))))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, url, str(work / f"report-{rows}")],
            check=True,
            capture_output=True,
            text=True,
        )
        runs.append({"rows": rows, **json.loads(done.stdout.strip().splitlines()[-1])})
        print(runs[-1], flush=True)
    slope, intercept = np.polyfit([r["rows"] for r in runs], [r["peak_rss_bytes"] for r in runs], 1)
    year = intercept + slope * YEAR_ROWS
    return {
        "runs": runs,
        "bytes_per_row": round(float(slope)),
        "intercept_bytes": round(float(intercept)),
        "year_rows": YEAR_ROWS,
        "year_peak_bytes_extrapolated": round(float(year)),
        "target_bytes": REPORT_TARGET_BYTES,
        "met": bool(year < REPORT_TARGET_BYTES),
    }


def _writes_while(ledger_url: str, action: Any) -> tuple[float, list[float]]:
    """Run `action()` while another connection writes one prediction every `WRITE_EVERY_S`;
    (the action's seconds, each write's seconds)."""
    writer = Ledger.open(ledger_url)
    delays: list[float] = []
    stop = threading.Event()

    def write() -> None:
        i = 10**7
        while not stop.is_set():
            row = _prediction(i, 10**8, 0.3)
            start = time.perf_counter()
            with writer.engine.begin() as connection:
                connection.execute(insert(Prediction.__table__), [row])
            delays.append(time.perf_counter() - start)
            i += 1
            stop.wait(WRITE_EVERY_S)

    thread = threading.Thread(target=write)
    thread.start()
    time.sleep(0.2)
    start = time.perf_counter()
    action()
    took = time.perf_counter() - start
    time.sleep(0.2)
    stop.set()
    thread.join()
    writer.close()
    return took, delays


def measure_outcomes(work: Path) -> dict[str, Any]:
    """The longest delay of a concurrent write while 20,000 outcomes are recorded, chunked and
    in one transaction."""
    results: dict[str, Any] = {"outcomes": OUTCOMES, "chunk": ledger_outcomes.CHUNK}
    chunk = ledger_outcomes.CHUNK
    for name, rows_a_transaction in (("one_transaction", OUTCOMES), ("chunked", chunk)):
        url = f"sqlite:///{work / f'outcomes-{name}.sqlite3'}"
        ledger = Ledger.open(url)
        populate(ledger, OUTCOMES)
        with ledger.engine.begin() as connection:
            connection.execute(Attribute.__table__.delete())
            connection.execute(Outcome.__table__.delete())
        joined = [
            OutcomeRow(
                str(uuid.UUID(int=i + 1, version=4)),
                "known",
                i % 7 == 0,
                datetime(2150, 1, 4) + timedelta(hours=i),
                {"sex": "female", "age_band": "65-79", "admission_type": "emergency"},
            )
            for i in range(OUTCOMES)
        ]
        ledger_outcomes.CHUNK = rows_a_transaction
        try:
            took, delays = _writes_while(
                url,
                lambda joined=joined, ledger=ledger: record_outcomes(
                    ledger, joined, source="bench", data_end=None, joined_at=datetime.now(UTC)
                ),
            )
        finally:
            ledger_outcomes.CHUNK = chunk
            ledger.close()
        results[name] = {
            "record_s": round(took, 2),
            "writes": len(delays),
            "write_p50_ms": round(float(np.percentile(delays, 50)) * 1000, 1),
            "write_max_s": round(max(delays), 3),
        }
        print(name, results[name], flush=True)
    results["target_s"] = DELAY_TARGET_S
    results["met"] = results["chunked"]["write_max_s"] <= DELAY_TARGET_S
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        results = {
            "outcomes": measure_outcomes(Path(work)),
            "report": measure_report(tuple(args.sizes), Path(work)),
        }
    print(json.dumps(results, indent=1))
    write_results(args.out, "python -m tools.benchmarks.bench_ledger_bounds", results)


if __name__ == "__main__":
    main()
