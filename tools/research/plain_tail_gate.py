"""The default artefact's rows read with a shorter plain tail: its fidelity gate's ICU-mortality
windows (the ones with a probability) answered again in MedTPE mode with the last `k` ids of the
record unmerged, against the original model's answers the gate stored (`build_report.json`).
The rows stay as built (distilled with the artefact's own tail): what serving them with another
tail does, before a build trains rows for it.

    .venv/bin/python -m tools.research.plain_tail_gate --tails 256,128,0 \\
        --out tools/research/results/plain_tail_gate.json

The artefact's own tail must give back the gate's stored MedTPE answers (the check that this is
the gate's path: p("yes") within `--check-tolerance`). Same engine settings as the gate (float32
unless the build said otherwise, eager, prefix caching off, the service's default decoding).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from medtpe.core.meds import PredictionPoint
from medtpe.core.meds.prediction_point import subject_of
from medtpe.core.paths import default_artefact_dir, default_export_dir, default_model_dir
from medtpe.core.tasks import get_task
from medtpe.evaluation.runner import evaluate_mode, measured
from medtpe.inference.engines.factories import start_vllm
from medtpe.inference.model import load_model
from medtpe.training.build_artefact import gate_model
from medtpe.training.build_config import build_config
from medtpe.training.fidelity_gate import SERVICE_SAMPLING, gate_records
from tools.benchmarks.results_file import write_results

TASK = "icu_mortality"


def stored_answers(report: dict[str, Any], budget: str) -> dict[str, tuple[float, float]]:
    """The gate's windows with a probability at `budget`: key -> (original p, MedTPE p)."""
    return {
        pair["original"]["key"]: (pair["original"]["p_yes"], pair["medtpe"]["p_yes"])
        for pair in report["gate"][budget]["records"]
        if pair["original"]["p_yes"] is not None
    }


def point(key: str) -> PredictionPoint:
    """The gate window of a record key (`record_key`: `subject@time`)."""
    return PredictionPoint(
        subject_of(key), datetime.fromisoformat(key.partition("@")[2]), task=TASK
    )


async def answer(artefact: Path, tails: list[int], tolerance: float) -> dict[str, Any]:
    """Every tail's MedTPE answers at each gate budget on one engine, paired with the stored
    original answers; the artefact's own tail must give the gate's stored MedTPE answers back
    (p within `tolerance`)."""
    config = build_config(artefact / "build.yaml", {"base": str(default_model_dir())})
    report = json.loads((artefact / "build_report.json").read_text())
    model = load_model(measured(gate_model(config, artefact, default_export_dir())))
    engine = start_vllm(model.engine_config)
    task = get_task(TASK)
    own = model.predictor.tokenizer.plain_tail
    results: dict[str, Any] = {}
    answers = {budget: stored_answers(report, budget) for budget in report["gate"]}
    keys = sorted({key for stored in answers.values() for key in stored})
    [records] = gate_records(config.meds, [point(key) for key in keys]).values()  # read once
    by_key = {record.key: record for record in records}
    try:
        for budget, stored in answers.items():
            windows = [by_key[key] for key in stored]
            for k in tails:
                predictor = model.predictor.at_budget(int(budget))
                predictor.tokenizer = predictor.tokenizer.with_settings(plain_tail=k)
                rows = await evaluate_mode(engine, predictor, task, windows, SERVICE_SAMPLING)
                pairs = [(stored[r.key], r) for r in rows]
                deltas = [abs(r.p_yes - original) for (original, _), r in pairs]
                results[f"{budget} tail {k}"] = {
                    "windows": len(rows),
                    "same_answer": sum((r.p_yes > 0.5) == (o > 0.5) for (o, _), r in pairs),
                    "delta_p_mean": round(statistics.mean(deltas), 5),
                    "delta_p_max": round(max(deltas), 5),
                    "medtpe_tokens": sum(r.n_tokens for r in rows),
                    "original_tokens": sum(r.original_tokens for r in rows),
                    "gate_medtpe_delta_max": round(
                        max(abs(r.p_yes - gated) for (_, gated), r in pairs), 7
                    ),
                    "p_yes": {r.key: r.p_yes for r in rows},
                }
                shown = {n: v for n, v in results[f"{budget} tail {k}"].items() if n != "p_yes"}
                print(budget, "tail", k, shown, flush=True)
                if k == own and shown["gate_medtpe_delta_max"] > tolerance:
                    raise SystemExit(f"tail {k} at {budget}: not the gate's answers ({shown})")
    finally:
        engine.shutdown()
    return results


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artefact", type=Path, default=default_artefact_dir())
    parser.add_argument("--tails", default="256,128,0", help="Plain tails, comma-separated.")
    parser.add_argument("--check-tolerance", type=float, default=1e-4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    tails = [int(k) for k in args.tails.split(",")]
    results = asyncio.run(answer(args.artefact, tails, args.check_tolerance))
    write_results(args.out, " ".join(sys.argv), results)


if __name__ == "__main__":
    main()
