"""`medtpe verify` on real-engine ledger rows: `medtpe predict` scores the first N ICU stays of
the shared MIMIC-IV demo's ICU-mortality labels on the real vLLM engine (default model and
artefact) into a ledger of its own, then every row is checked the way `medtpe verify ID --meds
DIR` checks it — signature, row against receipt, then record, artefact, rendering, prompt ids,
answer and p("yes") re-derived with the receipt's decoding settings — on one engine started once
for all rows (the command starts one per call).

    .venv/bin/python -m tools.benchmarks.bench_verify --meds ../shared/data/mimic-iv-demo-meds \
        --records 20 --dtype float32 --out tools/benchmarks/results/bench_verify_float32.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from medtpe.cli.command_line import medtpe_command
from medtpe.cli.ledger_commands import RecordSource, rederive
from medtpe.ledger.settings import LedgerSettings
from medtpe.ledger.verification import P_TOLERANCE, check_row, compare


class _KeptEngine:
    """An engine whose `shutdown` is left to its owner: `rederive` stops the engine it is given
    after each row, this one serves every row."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def shutdown(self) -> None:
        """Kept running for the next row."""


def main() -> None:
    """Score, then verify every row; write the per-part counts and |Δp| to `--out`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meds", type=Path, required=True)
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--max-input-tokens", type=int, default=2048)
    parser.add_argument("--dtype", default="auto", help="The engine's dtype (`medtpe predict`).")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="medtpe-bench-verify-"))
    labels = work / "labels.parquet"
    pq.write_table(
        pq.read_table(args.meds / "labels" / "icu_mortality.parquet").slice(0, args.records),
        labels,
    )
    ledger_url = f"sqlite:///{work / 'ledger.sqlite3'}"
    env = {**os.environ, "MEDTPE_LEDGER_URL": ledger_url, "MEDTPE_TASK": "icu_mortality"}
    command = medtpe_command(
        "predict",
        meds=args.meds,
        labels=labels,
        out=work / "out",
        max_input_tokens=args.max_input_tokens,
        kv_cache_gib=2,
        dtype=args.dtype,
    )
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    predict_s = time.perf_counter() - started

    settings = LedgerSettings.from_environ(env)
    key = settings.signer().public_key
    ledger = settings.open_ledger()
    rows = list(ledger.rows(task="icu_mortality"))
    ledger.close()

    from medtpe.inference.engines.factories import start_vllm

    kept: dict[str, _KeptEngine] = {}

    def start_once(config: Any) -> _KeptEngine:
        if "engine" not in kept:
            kept["engine"] = _KeptEngine(start_vllm(config))
        return kept["engine"]

    source = RecordSource(args.meds, (), None)
    loop = asyncio.new_event_loop()  # the engine belongs to the loop that first used it
    results, started = [], time.perf_counter()
    for row in rows:
        receipt, checks = check_row(row, key)
        assert receipt is not None, row.prediction_id
        files = {"codes_dir": args.meds}
        again = rederive(row, receipt, source, files, start_once, loop.run_until_complete)
        checks += compare(receipt, again, P_TOLERANCE)
        delta = None
        if receipt.p_yes is not None and again.p_yes is not None:
            delta = abs(receipt.p_yes - again.p_yes)
        results.append(
            {
                "prediction_id": row.prediction_id,
                "subject_id": row.subject_id,
                "checks": {c.part: c.ok for c in checks},
                "abs_dp": delta,
                "answer": receipt.answer,
            }
        )
    verify_s = time.perf_counter() - started
    if "engine" in kept:
        kept["engine"].engine.shutdown()

    parts = sorted({part for r in results for part in r["checks"]})
    deltas = [r["abs_dp"] for r in results if r["abs_dp"] is not None]
    summary = {
        "rows": len(results),
        "ok_per_part": {p: sum(r["checks"].get(p, False) for r in results) for p in parts},
        "all_ok": sum(all(r["checks"].values()) for r in results),
        "p_tolerance": P_TOLERANCE,
        "max_abs_dp": max(deltas, default=None),
        "predict_s": round(predict_s, 1),
        "verify_s": round(verify_s, 1),
    }
    out = {
        "command": "python -m tools.benchmarks.bench_verify "
        f"--records {args.records} --max-input-tokens {args.max_input_tokens} --dtype {args.dtype}",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "summary": summary,
        "rows": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
