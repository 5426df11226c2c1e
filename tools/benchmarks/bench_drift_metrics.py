"""What the drift counters cost per answered request: computing one prepared record's drift
figures (`medtpe.inference.drift`) and adding them to the service's counters
(`ServiceMetrics.observe_drift`), on the default artefact's held-out ICU stays at an 8k-token
input budget (tokenizer only, no engine).

    .venv/bin/python -m tools.benchmarks.bench_drift_metrics \
        --out tools/benchmarks/results/bench_drift_metrics.json

Paired per record: the metrics a request records without the drift counters (`observe_answer`,
"off") and with them (`observe_answer` then `observe_drift`, "on"), alternating which side runs
first, `--repeats` times each; the per-request cost is the difference of the two sides' median
times per record. Both sides' other metrics must read the same (the exposition without the drift
families is compared). Also the figures themselves over the set, against the build's compression.
Target: at most 1 ms per request.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from medtpe.core.meds import MedsDataset, read_labels
from medtpe.core.paths import default_artefact_dir, default_model_dir
from medtpe.core.tasks import get_task
from medtpe.inference.drift import build_compression_rate, drift_figures
from medtpe.inference.model import LoadedModel, ModelConfig, load_model
from medtpe.inference.predictor import Answer, PreparedRecord
from medtpe.service.plumbing.metrics import API_SITE, ServiceMetrics
from medtpe.training.build_config import build_config
from tools.benchmarks.results_file import write_results

TASK = "icu_mortality"
BUDGET = 8192
TARGET_MS = 1.0
ANSWER = Answer(prediction="no", format_ok=True, samples=[], generate_s=0.5, n_generated=4)
DRIFT_PREFIXES = ("medtpe_drift_", "medtpe_artefact_build_")


def held_out_records(artefact: Path, model: LoadedModel) -> list[PreparedRecord]:
    """The held-out subjects' ICU stays at the ICU-mortality prediction time, prepared."""
    config = build_config(artefact / "build.yaml", {"base": str(default_model_dir())})
    held = set(json.loads((artefact / "build_report.json").read_text())["held_out_subjects"])
    meds = Path(config.meds)
    dataset = MedsDataset.load(meds)
    task = get_task(TASK)
    points = [p for p in read_labels(meds / "labels" / f"{TASK}.parquet") if p.subject_id in held]
    return [
        model.predictor.prepare(task, dataset.events(p.subject_id), p.prediction_time)
        for p in points
    ]


def timed_ns(call: object) -> int:
    start = time.perf_counter_ns()
    call()  # type: ignore[operator]
    return time.perf_counter_ns() - start


def without_drift(metrics: ServiceMetrics) -> list[str]:
    """The exposition's lines but the drift families'."""
    lines = metrics.render().decode().splitlines()
    return [line for line in lines if not any(p in line for p in DRIFT_PREFIXES)]


def paired(model: LoadedModel, records: list[PreparedRecord], repeats: int) -> dict:
    """Per record, the median time of the off and on sides; the differences' summary."""
    off, on = ServiceMetrics(), ServiceMetrics()
    mode = model.predictor.mode

    def record_off(r: PreparedRecord) -> None:
        off.observe_answer(TASK, mode, r.segmentation, ANSWER)

    def record_on(r: PreparedRecord) -> None:
        on.observe_answer(TASK, mode, r.segmentation, ANSWER)
        on.observe_drift(API_SITE, model, r)

    record_on(records[0])  # first use: the merged-id mask and the build figure, once per model
    record_off(records[0])
    deltas_ms, on_ms, off_ms = [], [], []
    for i in range(repeats):
        for r in records:
            sides = [("off", record_off), ("on", record_on)]
            if i % 2:
                sides.reverse()
            times = {name: timed_ns(lambda f=f, r=r: f(r)) for name, f in sides}
            off_ms.append(times["off"] / 1e6)
            on_ms.append(times["on"] / 1e6)
    n = len(records)
    per_record = [
        statistics.median(on_ms[j::n]) - statistics.median(off_ms[j::n]) for j in range(n)
    ]
    deltas_ms = sorted(per_record)
    assert without_drift(on) == without_drift(off), "the drift counters changed other metrics"
    return {
        "repeats_per_record": repeats,
        "off_median_ms": round(statistics.median(off_ms), 4),
        "on_median_ms": round(statistics.median(on_ms), 4),
        "added_ms_median": round(statistics.median(deltas_ms), 4),
        "added_ms_mean": round(statistics.mean(deltas_ms), 4),
        "added_ms_max_record": round(deltas_ms[-1], 4),
        "other_metrics_equal": True,
        "target_ms": TARGET_MS,
        "meets_target": deltas_ms[-1] <= TARGET_MS,
    }


def summary(model: LoadedModel, records: list[PreparedRecord]) -> dict:
    """The drift figures over the set, as the alerts' ratios read them."""
    predictor = model.predictor
    figures = [drift_figures(r, predictor.tokenizer, predictor.descriptions) for r in records]
    events = sum(f.events for f in figures)
    dropped = sum(f.events_dropped for f in figures)
    original = sum(f.original_tokens for f in figures)
    medtpe = sum(f.medtpe_tokens for f in figures)
    return {
        "events": events,
        "events_shown_mean": round((events - dropped) / len(figures), 1),
        "prompt_original_tokens_mean": round(original / len(figures), 1),
        "compression": round(1 - medtpe / original, 4),
        "build_compression": build_compression_rate(model.bundle.path),
        "undescribed_share": round(
            sum(f.events_undescribed for f in figures) / (events - dropped), 4
        ),
        "dropped_share": round(dropped / events, 4),
        "merged_share": round(sum(f.merged_tokens for f in figures) / medtpe, 4),
    }


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artefact", type=Path, default=default_artefact_dir())
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    model = load_model(ModelConfig(artefact_dir=args.artefact, max_input_tokens=BUDGET))
    records = held_out_records(args.artefact, model)
    results = {
        "task": TASK,
        "budget": model.predictor.max_input_tokens,
        "records": len(records),
        "figures": summary(model, records),
        "cost": paired(model, records, args.repeats),
    }
    print(json.dumps(results, indent=1), flush=True)
    write_results(args.out, " ".join(sys.argv), results)


if __name__ == "__main__":
    main()
