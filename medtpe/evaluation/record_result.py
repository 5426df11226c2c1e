"""Per-record evaluation results: what one mode produced for one labelled record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from medtpe.core.figure_names import current_names


@dataclass(frozen=True)
class RecordResult:
    """The outcome of one record under one mode (`original` or `medtpe`).

    `prediction` is the parsed (majority-voted) answer, `None` when no sample parsed;
    `latency_s` is the whole request path and `generate_s` its engine part; `n_tokens` counts
    the prompt tokens fed to the model in this mode and `original_tokens` the same prompt
    under the original tokenizer, so both modes of one record share `original_tokens` (equal
    input information). `load_avg_1m` is the machine's 1-minute load average right after the
    record (other processes competing for the cores make latencies noisy). `probabilities` are
    the answer options' probabilities from the first answer token and `p_yes` that of the
    positive answer (`yes`) of a binary task; None when not measured (results written before
    they were, tasks without a closed set of options) or when no top token matched an option.
    """

    key: str
    label: Any
    prediction: Any
    format_ok: bool
    latency_s: float
    generate_s: float
    n_tokens: int
    original_tokens: int
    load_avg_1m: float = 0.0
    votes: list[Any] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    probabilities: dict[str, float] | None = None
    p_yes: float | None = None
    finishes: list[str] = field(default_factory=list)
    """How each sample's generation ended (`medtpe.inference.engines.protocol.Finish`)."""
    trailing: list[str] = field(default_factory=list)
    """Each sample's text after its answer object ("" when none)."""
    n_generated: int = 0
    """Tokens generated over all samples."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (sets become sorted lists)."""
        data = asdict(self)
        for name in ("label", "prediction"):
            data[name] = _jsonable(data[name])
        data["votes"] = [_jsonable(vote) for vote in data["votes"]]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecordResult:
        """A result from its JSON object (`to_json`'s, or an earlier release's: keys renamed
        since read under their current names, `medtpe.core.figure_names.RENAMED`)."""
        return cls(**current_names(data))


def _jsonable(value: Any) -> Any:
    """Sets and tuples (multi-label answers) as sorted lists; anything else unchanged."""
    if isinstance(value, set | frozenset | tuple):
        return sorted(value)
    return value
