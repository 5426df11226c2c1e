"""How one record's answer is decoded: the one settings type every door passes to
`Predictor.answer` (`/predict` and `/predict/batch` from their request options, a CDS hook, the
batch job, the evaluation), and what a prediction's receipt records of its decoding (`as_dict`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Sampling:
    """The decoding settings of one answer."""

    n_samples: int = 1
    """Answers generated; the majority wins (one greedy answer, counted `n_samples` times, at
    temperature 0)."""
    temperature: float = 0.0
    max_new_tokens: int = 64
    probabilities: bool = True
    """Ask for the answer options' probabilities from the answer value's first token (tasks with
    a closed set of options)."""
    constrained: bool = False
    """Decoding restricted to well-formed answers (the engine's structured outputs)."""
    seed: int | None = None
    """The engine's sampling seed for this answer (None: the engine's own)."""

    def __post_init__(self) -> None:
        if self.n_samples < 1:
            raise ValueError(f"n_samples must be at least 1, not {self.n_samples}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be at least 0, not {self.temperature}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, not {self.max_new_tokens}")

    def as_dict(self) -> dict[str, Any]:
        """The settings as JSON values under their field names, keys sorted (a canonical form:
        equal settings give equal dicts, e.g. for a signed receipt)."""
        data = asdict(self)
        data["temperature"] = float(self.temperature)
        return dict(sorted(data.items()))
