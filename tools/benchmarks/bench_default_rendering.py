"""What the default service's rendering gives on the default artefact's held-out patients: the
artefact's own code descriptions (what a service with no settings loads) against none, tokenizer
only (no engine), at the served budget.

    .venv/bin/python -m tools.benchmarks.bench_default_rendering \
        --out tools/benchmarks/results/bench_default_rendering.json

Two sets of records of the 13 patients the build held out (`build_report.json`): the build's own
windows of them (6–120 h after ICU admission, as the build samples them) and their ICU stays at
the ICU-mortality label's prediction time (24 h after admission). Per set and rendering: events
kept (mean), records cut to the budget, prompt tokens under both tokenizers, how much shorter
MedTPE makes them (over all tokens, and the mean of the records' own rates).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from medtpe.core.meds import MedsDataset, read_labels
from medtpe.core.paths import default_artefact_dir, default_model_dir
from medtpe.core.tasks import get_task
from medtpe.inference.model import LoadedModel, ModelConfig, load_model
from medtpe.training.build_config import build_config
from medtpe.training.build_data import prediction_times
from tools.benchmarks.results_file import write_results

TASK = "icu_mortality"


def figures(model: LoadedModel, dataset: MedsDataset, points: list[tuple[int, datetime]]) -> dict:
    """Events kept, records cut and compression of `points` rendered by `model`'s predictor."""
    task = get_task(TASK)
    started = time.perf_counter()
    rows = []
    for subject, when in points:
        prepared = model.predictor.prepare(task, dataset.events(subject), when)
        seg = prepared.segmentation
        prompt = prepared.prompt
        rows.append(
            (
                prompt.n_events_kept,
                prompt.n_events_total,
                len(seg.original_ids),
                len(seg.medtpe_ids),
            )
        )
    original = sum(row[2] for row in rows)
    medtpe = sum(row[3] for row in rows)
    return {
        "budget": model.predictor.max_input_tokens,
        "records": len(rows),
        "descriptions": model.rendering.descriptions,
        "matches_artefact": model.rendering.matches_artefact,
        "events_kept_mean": round(statistics.mean(row[0] for row in rows), 1),
        "cut_to_budget": sum(kept < total for kept, total, _, _ in rows),
        "original_tokens": original,
        "medtpe_tokens": medtpe,
        "shorter_total": round(1 - medtpe / original, 4),
        "shorter_mean": round(statistics.mean(1 - row[3] / row[2] for row in rows), 4),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artefact", type=Path, default=default_artefact_dir())
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    config = build_config(args.artefact / "build.yaml", {"base": str(default_model_dir())})
    report = json.loads((args.artefact / "build_report.json").read_text())
    held = set(report["held_out_subjects"])
    meds = Path(config.meds)
    sets = {
        "held-out windows (the build's, 6-120 h)": [
            (s, t) for s, t in prediction_times(config) if s in held
        ],
        "held-out ICU stays (24 h)": [
            (p.subject_id, p.prediction_time)
            for p in read_labels(meds / "labels" / f"{TASK}.parquet")
            if p.subject_id in held
        ],
    }
    dataset = MedsDataset.load(meds)
    with tempfile.TemporaryDirectory() as empty:
        models = {
            "artefact's descriptions (default)": load_model(
                ModelConfig(artefact_dir=args.artefact)
            ),
            "no descriptions": load_model(
                ModelConfig(artefact_dir=args.artefact, codes_dir=Path(empty), codes_replace=True)
            ),
        }
    results: dict[str, Any] = {}
    for label, points in sets.items():
        for name, model in models.items():
            results[f"{label} | {name}"] = figures(model, dataset, points)
            print(label, "|", name, results[f"{label} | {name}"], flush=True)
    write_results(args.out, " ".join(sys.argv), results)


if __name__ == "__main__":
    main()
