"""meds-evaluation's own scores of a predictions file (`medtpe.evaluation.predictions`), beside the
report's: an outside check of the project's metrics on the same answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def meds_evaluation_scores(path: Path) -> dict[str, Any]:
    """meds-evaluation's binary-classification scores of the predictions file at `path` (its
    Python entry point, with its command line's defaults); `{"error": message}` where it cannot
    score (e.g. scikit-learn's AUROC on one class only)."""
    import polars as pl
    from meds_evaluation.evaluate import evaluate_binary_classification

    try:
        scores = evaluate_binary_classification(pl.read_parquet(path))
    except ValueError as exc:
        return {"error": str(exc)}
    return json.loads(json.dumps(scores, default=float))
