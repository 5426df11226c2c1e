"""The ledger's store side: what one `Ledger.record` of a typical `/predict` row costs on the
embedded SQLite file (WAL, synchronous=NORMAL) and on a local PostgreSQL server this script
starts (Debian's package, `tests/support/postgres.py`), and the rows per second of the batch
job's writes (1,000 rows a transaction). Also what a door spends building the row: the
record digest of a 2,000-event ICU-sized record (and its canonical JSON, kept with
`MEDTPE_LEDGER_RECORDS=store`), the prompt ids' digest (4,096 ids) and the
Ed25519 signature.

Each request-sized write is one transaction of one row, committed before the next (PostgreSQL
fsyncs each commit, SQLite's WAL at checkpoints); the
rows are built before the clock starts. Every row written is read back and compared at the
end, and the count checked (nothing lost or doubled); then the whole ledger is audited
(`medtpe.ledger.audit`: its hash chain, every row's signature) and timed.

    .venv/bin/python -m tools.benchmarks.bench_ledger --records 400 --batch-rows 20000 \\
        --out tools/benchmarks/results/bench_ledger.json

Side by side with other code (`--against DIR`: a checkout of it, e.g. `git worktree add DIR
COMMIT`): the same measurement run `--rounds` times by each side's own copy of this script, in
a process of its own, the sides alternating (before, after; then after, before …) so both see
the same load; the results hold each run and each side's median p50s and rows per second.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from medtpe.core.meds import SubjectEvents
from medtpe.core.meds.canonical import canonical_record, record_digest
from medtpe.ledger.audit import audit
from medtpe.ledger.receipt import prompt_ids_digest
from medtpe.ledger.store import Ledger, PredictionRow
from tests.support.ledger_rows import SIGNER, receipt, row
from tests.support.postgres import POSTGRES_BIN, running_postgres
from tests.support.server_fixtures import fresh_database
from tools.benchmarks.results_file import write_results

BATCH_TRANSACTION_ROWS = 1_000


def percentiles(seconds: list[float]) -> dict[str, float]:
    """p50, p95 and max in milliseconds."""
    ms = sorted(s * 1000 for s in seconds)
    return {
        "p50_ms": round(statistics.median(ms), 3),
        "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 3),
        "max_ms": round(ms[-1], 3),
    }


def request_writes(ledger: Ledger, rows: list[PredictionRow]) -> dict[str, Any]:
    """One `record` per row, timed each."""
    seconds = []
    for made in rows:
        start = time.perf_counter()
        ledger.record([made])
        seconds.append(time.perf_counter() - start)
    return percentiles(seconds)


def batch_writes(ledger: Ledger, rows: list[PredictionRow]) -> dict[str, Any]:
    """The rows in transactions of `BATCH_TRANSACTION_ROWS`, timed together."""
    start = time.perf_counter()
    for first in range(0, len(rows), BATCH_TRANSACTION_ROWS):
        ledger.record(rows[first : first + BATCH_TRANSACTION_ROWS])
    seconds = time.perf_counter() - start
    return {
        "rows": len(rows),
        "seconds": round(seconds, 3),
        "rows_per_s": round(len(rows) / seconds),
    }


def read_back(ledger: Ledger, rows: list[PredictionRow]) -> bool:
    """Every row there exactly as written (its record dropped: `digest`), nothing else."""
    stored = {r.prediction_id: r for r in ledger.rows()}
    return len(stored) == len(rows) and all(
        stored[r.prediction_id] == dataclasses.replace(r, record=None) for r in rows
    )


def measure(url: str, request_rows: list[PredictionRow], batch: list[PredictionRow]) -> dict:
    """Request-sized and batch writes on a fresh ledger at `url`, checked, then audited whole
    (`medtpe ledger audit`'s walk: chain, signatures, checkpoints)."""
    ledger = Ledger.open(url)
    try:
        requests = request_writes(ledger, request_rows)
        batches = batch_writes(ledger, batch)
        intact = read_back(ledger, request_rows + batch)
        start = time.perf_counter()
        audited = audit(ledger.engine, SIGNER.public_key, deadline_s=600)
        seconds = time.perf_counter() - start
    finally:
        ledger.close()
    return {
        "one_row_per_request": requests,
        "batch": batches,
        "read_back_intact": intact,
        "audit": {
            "rows": audited.rows,
            "intact": audited.finding is None,
            "seconds": round(seconds, 3),
            "rows_per_s": round(audited.rows / seconds),
        },
    }


def icu_record(n_events: int = 2_000) -> SubjectEvents:
    """An ICU-sized record: `n_events` lab and chart events a minute apart."""
    rng = np.random.default_rng(0)
    times = np.datetime64("2020-01-01T00:00", "us") + np.arange(n_events) * np.timedelta64(
        60_000_000, "us"
    )
    codes = [f"LAB//{50_000 + int(c)}" for c in rng.integers(0, 300, n_events)]
    return SubjectEvents(1, times, codes, rng.normal(size=n_events), [None] * n_events)


def row_building(repeats: int = 50) -> dict[str, Any]:
    """What a door spends on the receipt of one answer, p50 over `repeats`."""
    events = icu_record()
    ids = list(range(4_096))
    made = receipt(0)
    steps: dict[str, Callable[[], object]] = {
        "record_digest": lambda: record_digest(events, None),
        "canonical_record (MEDTPE_LEDGER_RECORDS=store)": lambda: canonical_record(events, None),
        "prompt_ids_digest": lambda: prompt_ids_digest(ids),
        "sign": lambda: SIGNER.sign(made),
    }
    out = {}
    for name, step in steps.items():
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - start)
        out[name] = percentiles(seconds)["p50_ms"]
    return {"events": len(events), "prompt_ids": len(ids), "p50_ms": out}


def side_by_side(against: Path, records: int, batch_rows: int, rounds: int) -> dict[str, Any]:
    """The measurement by the code in `against` ("before") and this code ("after"), each side's
    own script in a process of its own, `rounds` times, alternating the sides."""
    sides = {"before": against.resolve(), "after": Path(__file__).resolve().parents[2]}
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(rounds):
            for side in ("before", "after") if round_ % 2 == 0 else ("after", "before"):
                out = Path(folder) / f"{side}-{round_}.json"
                command = [sys.executable, "-m", "tools.benchmarks.bench_ledger"]
                command += ["--records", str(records), "--batch-rows", str(batch_rows)]
                subprocess.run([*command, "--out", str(out)], cwd=sides[side], check=True)
                runs[side].append(json.loads(out.read_text())["results"])
    return {"sides": {side: str(root) for side, root in sides.items()}, "runs": runs} | {
        "median": {side: _medians(found) for side, found in runs.items()}
    }


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each database's median over `runs` of the one-row p50 and the batch rows per second."""
    out: dict[str, Any] = {}
    for database in ("sqlite", "postgresql"):
        measured = [run[database] for run in runs if isinstance(run[database], dict)]
        if measured:
            out[database] = {
                "one_row_p50_ms": statistics.median(
                    m["one_row_per_request"]["p50_ms"] for m in measured
                ),
                "batch_rows_per_s": statistics.median(m["batch"]["rows_per_s"] for m in measured),
                "read_back_intact": all(m["read_back_intact"] for m in measured),
            }
    return out


def main(argv: list[str] | None = None) -> None:
    """Run the measurements and write the results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--batch-rows", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--against", type=Path, default=None, help="a checkout of other code")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    command = " ".join(["python -m tools.benchmarks.bench_ledger", *sys.argv[1:]])
    if args.against is not None:
        compared = side_by_side(args.against, args.records, args.batch_rows, args.rounds)
        print(json.dumps(compared["median"], indent=1))
        write_results(args.out, command, compared)
        return
    request_rows = [row(i) for i in range(args.records)]
    batch = [row(i) for i in range(args.records, args.records + args.batch_rows)]
    results: dict[str, Any] = {"records": args.records, "row_building": row_building()}
    with tempfile.TemporaryDirectory() as folder:
        results["sqlite"] = measure(
            f"sqlite:///{Path(folder) / 'ledger.sqlite3'}", request_rows, batch
        )
    if POSTGRES_BIN is None:
        results["postgresql"] = "not measured: PostgreSQL is not installed"
    else:
        with running_postgres() as server:
            results["postgresql"] = measure(fresh_database(server), request_rows, batch)
    print(results)
    write_results(args.out, command, results)


if __name__ == "__main__":
    main()
