"""Metrics: scores with patient-level bootstrap intervals, the compression rate, and fidelity
(does the MedTPE model answer as the original one, record by record).

    from medtpe.core.metrics import compression_rate

    compression_rate(original=1000, compressed=480)  # 0.52: the share of tokens removed

Modules: `scores` (F1, AUROC, AUPRC, Brier, ECE, agreement, intervals, compression rate),
`fidelity` (the paired figures of both models' answers).
"""

from medtpe.core.metrics.fidelity import PairedAnswer
from medtpe.core.metrics.scores import (
    Interval,
    compression_rate,
    interval,
    subject_resample_weights,
)

__all__ = [
    "Interval",
    "PairedAnswer",
    "compression_rate",
    "fidelity",
    "interval",
    "scores",
    "subject_resample_weights",
]
