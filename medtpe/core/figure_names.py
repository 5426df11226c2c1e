"""One name per figure of an answer, the prediction ledger's (`medtpe.ledger.schema.Prediction`):
`p_yes` (the probability of the positive answer, `yes`), `original_tokens` and `medtpe_tokens`
(the prompt under each tokenizer). Batch records files (`medtpe predict`'s
`<shard>.records.pq`), evaluation reports (`medtpe evaluate`, the fidelity gate's records in a
build report) and figures named after them use these names.

Files written before spelled them otherwise; `RENAMED` maps each earlier key to its name, and
the readers of those files (`medtpe.batch.rows.read_records`,
`medtpe.evaluation.report_schema.EvaluationReport.from_json`,
`medtpe.evaluation.record_result.RecordResult.from_json`) read it through `current_names`.
Writers write only the current names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RENAMED: Mapping[str, str] = {
    # a record's figures (batch records files, evaluation reports' records)
    "p_positive": "p_yes",
    "n_tokens_original": "original_tokens",
    "n_tokens_medtpe": "medtpe_tokens",
    # an evaluation mode's figures
    "p_positive_n": "p_yes_n",
    "tokens_original_mean": "original_tokens_mean",
    # an evaluation report's shift of p(yes) between modes
    "p_positive_correlation": "p_yes_correlation",
    "p_positive_mae": "p_yes_mae",
    "p_positive_max_abs_diff": "p_yes_max_abs_diff",
    "p_positive_pairs": "p_yes_pairs",
}
"""Earlier key -> current name."""


def current_names(row: Mapping[str, Any]) -> dict[str, Any]:
    """`row` with each earlier key of `RENAMED` under its current name (order kept).

    >>> current_names({"record": 3, "p_positive": 0.25, "n_tokens_original": 900})
    {'record': 3, 'p_yes': 0.25, 'original_tokens': 900}
    """
    return {RENAMED.get(key, key): value for key, value in row.items()}
