"""Share of records on which two evaluation runs give the same answer, and how far apart their
probabilities of the positive answer are (`medtpe evaluate` reports, same records), e.g. the
"without SSFT" ablation against a Table-2 run's original mode:

    .venv/bin/python benchmarks/bench_eval_compare.py \\
        benchmarks/results/eval_table2_v2.json:original \\
        benchmarks/results/eval_ablation_no_ssft.json:medtpe
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evaluation.report import mode_agreement, positive_shift
from evaluation.results import RecordResult


def mode_records(spec: str) -> list[RecordResult]:
    """`REPORT.json:MODE` → that mode's per-record results."""
    path, _, mode = spec.rpartition(":")
    return [RecordResult(**row) for row in json.loads(Path(path).read_text())["records"][mode]]


def main() -> None:
    """Print the agreement of the two runs and the shift of `p_positive` between them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", help="REPORT.json:MODE")
    parser.add_argument("second", help="REPORT.json:MODE")
    args = parser.parse_args()
    first, second = mode_records(args.first), mode_records(args.second)
    summary = {"first": args.first, "second": args.second, **mode_agreement(first, second)}
    print(json.dumps(summary | positive_shift(first, second)))


if __name__ == "__main__":
    main()
