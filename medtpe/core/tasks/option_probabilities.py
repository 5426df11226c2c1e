"""Probabilities of a task's answer options from the model's first answer token.

With the answer prefill (`{"answer": "`) the first generated token already decides a closed-set
answer (`yes` / `no`, or an option letter). Its top-k log-probabilities give a continuous score
where the greedy answer alone gives a constant one: each token, as decoded by the tokenizer of
the mode (a MedTPE token decodes to its multi-character string), counts toward the option it
spells the start of.

Rules: the token's text, leading whitespace stripped and case-insensitive, counts toward an
option when it is a non-empty prefix of the option (`y`, `Ye`) or starts with it (`yes"}`); a
token that would count toward several options is skipped; the options' masses are normalised
to sum to 1 over the options (an option without mass gets 0). No mass at all gives None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from medtpe.core.tasks.task import Task


def matching_option(text: str, options: Sequence[str]) -> str | None:
    """The one option that `text` spells the start of (or starts with); None for none or several."""
    token = text.lstrip().lower()
    if not token:
        return None
    hits = [
        option
        for option in options
        if option.lower().startswith(token) or token.startswith(option.lower())
    ]
    return hits[0] if len(hits) == 1 else None


def option_probabilities(
    token_logprobs: Sequence[tuple[str, float]], options: Sequence[str]
) -> dict[str, float] | None:
    """{option: probability} from (decoded token text, logprob) pairs; None when no token counts
    toward any option."""
    matched = [
        (option, logprob)
        for text, logprob in token_logprobs
        if (option := matching_option(text, options)) is not None
    ]
    if not matched:
        return None
    top = max(logprob for _, logprob in matched)  # scale before exp: no underflow to 0
    mass = dict.fromkeys(options, 0.0)
    for option, logprob in matched:
        mass[option] += math.exp(logprob - top)
    total = sum(mass.values())
    return {option: value / total for option, value in mass.items()}


def positive_probability(task: Task, probabilities: Mapping[str, float] | None) -> float | None:
    """The probability of a binary task's positive answer (`yes`); None for other tasks or
    without probabilities."""
    if probabilities is None or task.positive_option is None:
        return None
    return probabilities[task.positive_option]
