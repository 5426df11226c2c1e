"""Label counts of every task derived from a MEDS dataset (`medtpe labels`' code): rows,
subjects and positive rows (multilabel: rows with at least one label), and, when `es-aces` is
installed, how the shipped ACES ICU-mortality configuration compares with the built-in one.

    .venv/bin/python -m tools.benchmarks.bench_labels --meds ../shared/data/mimic-iv-demo-meds \\
        --out tools/benchmarks/results/labels.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from medtpe.core.meds import MedsDataset, PredictionPoint
from medtpe.core.meds.labels import LABEL_FUNCTIONS, derive_labels
from medtpe.core.meds.labels.aces_labels import ACES_CONFIG_DIR, AcesUnavailable, aces_labels
from medtpe.core.tasks import get_task
from tools.benchmarks.results_file import write_results


def counts(rows: list[PredictionPoint]) -> dict[str, int]:
    """Rows, subjects and positive rows (a true, non-zero or non-empty value)."""
    return {
        "rows": len(rows),
        "subjects": len({row.subject_id for row in rows}),
        "positive_rows": sum(bool(row.label) for row in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--meds", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    dataset = MedsDataset.load(args.meds)
    results: dict[str, Any] = {}
    built_in: dict[str, list[PredictionPoint]] = {}
    for name in LABEL_FUNCTIONS:
        built_in[name] = derive_labels(dataset, get_task(name))
        results[name] = counts(built_in[name])
        print(name, results[name], flush=True)
    try:
        table = aces_labels(ACES_CONFIG_DIR / "icu_mortality.yaml", args.meds)
    except AcesUnavailable as exc:
        results["aces_icu_mortality"] = {"skipped": str(exc)}
    else:
        ours = {(r.subject_id, r.prediction_time): bool(r.label) for r in built_in["icu_mortality"]}
        columns = (table[name].to_pylist() for name in ("subject_id", "prediction_time"))
        keys = zip(*columns, strict=True)
        values = (bool(v) for v in table["boolean_value"].to_pylist())
        theirs = dict(zip(keys, values, strict=True))
        results["aces_icu_mortality"] = {
            "rows": len(theirs),
            "positive_rows": sum(theirs.values()),
            "same_rows_and_labels": sum(ours.get(key) == value for key, value in theirs.items()),
        }
    print(results.get("aces_icu_mortality"))
    write_results(args.out, " ".join(["-m tools.benchmarks.bench_labels", *sys.argv[1:]]), results)


if __name__ == "__main__":
    main()
