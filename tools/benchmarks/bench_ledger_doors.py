"""What the ledger adds at the doors, on the instant engine (no model time): `/predict`'s
latency with the ledger on the embedded SQLite file and on a local PostgreSQL server (Debian's
package, started here: `tests/support/postgres.py`) against the ledger off, paired per record
(each record sent to the three apps in turn, the order rotated), the answers compared; and the
rows per second `medtpe predict` records (`medtpe.batch.ledger_rows.RunRecorder`: the rows
committed 1,000 a transaction, as a shard's; the time building them — digests, signature — apart,
since the job builds each while the engine generates the next answers).

The three apps run in this process (`TestClient`, the same for each side); every answer's row
is read back at the end (one per answer on each ledger).

    .venv/bin/python -m tools.benchmarks.bench_ledger_doors --records 400 --batch-rows 10000 \\
        --out tools/benchmarks/results/bench_ledger_doors.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from medtpe.batch.ledger_rows import RunLedger
from medtpe.core.paths import cache_dir
from medtpe.core.tasks import get_task
from medtpe.inference.engines.instant import InstantEngine
from medtpe.inference.model import load_model
from medtpe.inference.record import MedsRecord
from medtpe.inference.sampling import Sampling
from medtpe.ledger.settings import LedgerSettings
from medtpe.ledger.store import Ledger
from medtpe.service.predict.schemas import PredictRequest
from tests.support.ledger_rows import RFC8037_SEED_B64 as SEED
from tests.support.postgres import POSTGRES_BIN, running_postgres
from tests.support.server_fixtures import fresh_database
from tests.support.service_support import (
    instant_client,
    instant_settings,
    record,
    service_artefact,
)
from tools.benchmarks.results_file import write_results

SIDES = ("off", "sqlite", "postgresql")
BATCH_COMMIT_ROWS = 1_000
AUTH = {"Authorization": "Bearer test-key-1"}


def percentiles(ms: list[float]) -> dict[str, float]:
    """p50, p95 and max of `ms`."""
    ordered = sorted(ms)
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 3),
        "max_ms": round(ordered[-1], 3),
    }


def predict_overhead(
    files: tuple[Path, Path], urls: dict[str, str], n_records: int
) -> dict[str, Any]:
    """`/predict` on the three apps, paired per record; the rows read back."""
    bodies = [record(i, 60, options={"return_probabilities": True}) for i in range(n_records)]
    latency: dict[str, list[float]] = {side: [] for side in SIDES}
    answers: dict[str, list[Any]] = {side: [] for side in SIDES}
    ids: dict[str, list[str]] = {side: [] for side in SIDES}
    with ExitStack() as stack:
        clients = {}
        for side in SIDES:
            overrides = (
                {"ledger_off": True}
                if side == "off"
                else {"ledger_url": urls[side], "ledger_signing_key": SEED}
            )
            settings = instant_settings(files, **overrides)
            clients[side] = stack.enter_context(instant_client(settings))
        for side in SIDES:  # warm-up: first requests pay imports and connections
            for body in bodies[:5]:
                clients[side].post("/predict", json=body, headers=AUTH)
        for i, body in enumerate(bodies):
            order = SIDES[i % 3 :] + SIDES[: i % 3]
            for side in order:
                start = time.perf_counter()
                answer = clients[side].post("/predict", json=body, headers=AUTH)
                latency[side].append((time.perf_counter() - start) * 1e3)
                assert answer.status_code == 200, answer.text
                data = answer.json()
                answers[side].append((data["prediction"], data["probabilities"]))
                ids[side].append(data["prediction_id"])
    same = all(answers[side] == answers["off"] for side in SIDES)
    results: dict[str, Any] = {"records": n_records, "same_answers": same}
    for side in SIDES:
        results[side] = percentiles(latency[side])
    for side in ("sqlite", "postgresql"):
        added = [on - off for on, off in zip(latency[side], latency["off"], strict=True)]
        results[f"{side}_added"] = percentiles(added)
        ledger = Ledger.open(urls[side])
        found = sum(ledger.get(pid) is not None for pid in ids[side])
        ledger.close()
        results[f"{side}_rows_found"] = found
    return results


def batch_rows(files: tuple[Path, Path], url: str, n_rows: int) -> dict[str, Any]:
    """Rows per second of `medtpe predict`'s recorder: built (digests, signature) and committed
    `BATCH_COMMIT_ROWS` a transaction, on prepared answers."""
    config = instant_settings(files).model()
    model = load_model(config)
    engine = InstantEngine.factory()(model.engine_config)
    task, sampling = get_task("icu_mortality"), Sampling(max_new_tokens=16)
    prepared = []
    for subject in range(20):
        events = PredictRequest.model_validate(record(subject, 60)).events
        assert events is not None
        prepared.append(MedsRecord(events, None).prepare(model.predictor, task))
    answers = [asyncio.run(model.predictor.answer(engine, p, sampling)) for p in prepared]
    settings = LedgerSettings(url, "digest", SEED)
    recorder = RunLedger(settings, "bench", "batch_meds").open(model)
    assert recorder is not None
    recorder.engine = engine
    building = writing = 0.0
    for i in range(n_rows):
        k = i % len(prepared)
        start = time.perf_counter()
        recorder.add(i, prepared[k], sampling, answers[k], 0.001)
        building += time.perf_counter() - start
        if len(recorder.pending) == BATCH_COMMIT_ROWS or i == n_rows - 1:
            start = time.perf_counter()
            recorder.commit()
            writing += time.perf_counter() - start
    count = sum(1 for _ in recorder.ledger.rows())
    recorder.close()
    return {
        "rows": n_rows,
        "rows_found": count,
        "build_ms_per_row": round(building / n_rows * 1e3, 3),
        "write_rows_per_s": round(n_rows / writing),
        "built_and_written_rows_per_s": round(n_rows / (building + writing)),
    }


def main(argv: list[str] | None = None) -> None:
    """Run the measurements and write the results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if POSTGRES_BIN is None:
        raise SystemExit("PostgreSQL is not installed (make deps-system)")
    cache = cache_dir() / "test-fixtures"
    cache.mkdir(parents=True, exist_ok=True)
    files = service_artefact(cache)
    load = {"loadavg_before": Path("/proc/loadavg").read_text().split()[:3]}
    with tempfile.TemporaryDirectory() as folder, running_postgres() as server:
        urls = {
            "sqlite": f"sqlite:///{Path(folder) / 'ledger.sqlite3'}",
            "postgresql": fresh_database(server),
        }
        results: dict[str, Any] = {"predict": predict_overhead(files, urls, args.records)}
        batch_url = f"sqlite:///{Path(folder) / 'batch.sqlite3'}"
        results["batch"] = {
            "sqlite": batch_rows(files, batch_url, args.batch_rows),
            "postgresql": batch_rows(files, fresh_database(server), args.batch_rows),
        }
    load["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    results["machine"] = load
    print(results)
    command = " ".join(["python -m tools.benchmarks.bench_ledger_doors", *sys.argv[1:]])
    write_results(args.out, command, results)


if __name__ == "__main__":
    main()
