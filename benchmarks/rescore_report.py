"""Re-score a `medtpe evaluate` report's stored per-record results with the current metrics
(F1, AUROC, AUPRC, Brier, ECE with patient-level bootstrap intervals, paired differences between
modes), write each mode's meds-evaluation predictions file and meds-evaluation's own scores of
it. No engine runs: the answers and p(yes) are the ones the report recorded.

    .venv/bin/python benchmarks/rescore_report.py benchmarks/results/eval_all_stays_1024.json \\
        --predictions-dir /tmp/rescored --out benchmarks/results/eval_all_stays_1024_rescored.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from evaluation.predictions import write_predictions
from evaluation.records import load_records
from evaluation.report import build_report
from evaluation.results import RecordResult
from medtpe_core.tasks import get_task


def meds_evaluation_cli(predictions: Path, out: Path) -> dict[str, Any]:
    """meds-evaluation's command line on a predictions file; its JSON output."""
    cli = Path(sys.executable).with_name("meds-evaluation-cli")
    subprocess.run(
        [str(cli), f"predictions_path={predictions}", f"output_file={out}"],
        check=True,
        capture_output=True,
    )
    return json.loads(out.read_text())


def main() -> None:
    """Rebuild the report from its records; add the meds-evaluation scores per mode."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--predictions-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    old = json.loads(args.report.read_text())
    settings = old["settings"]
    task = get_task(settings["task"])
    results = {mode: [RecordResult(**row) for row in rows] for mode, rows in old["records"].items()}
    report = build_report(task, results, settings=settings | {"rescored_from": str(args.report)})
    records = load_records(Path(settings["meds"]), Path(settings["labels"]), task)
    keys = {r.key for r in next(iter(results.values()))}
    records = [r for r in records if r.key in keys]
    report["meds_evaluation"] = {}
    for mode, rows in results.items():
        path = args.predictions_dir / f"{mode}.parquet"
        write_predictions(task, records, rows, path)
        scores = meds_evaluation_cli(path, args.predictions_dir / f"{mode}.scores.json")
        report["meds_evaluation"][mode] = scores
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
