"""The text of a risk card: a one-line summary under 140 characters and a Markdown detail.

The card states what the model answered and from what: the probability and its band, the data
window and the events used, the model and artefact, the prompt compression and when the score was
computed. It never quotes record content (no codes, values or notes), so a card can be logged
or forwarded without patient data beyond the risk itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from medtpe.core.cds.risk import Band, Indicator, RiskBands

SUMMARY_LIMIT = 140
"""CDS Hooks: a card's summary is under 140 characters."""
NOT_SHOWN = (
    "A language model's estimate from the structured FHIR data listed above, not a diagnosis: "
    "notes, images and anything outside the data window are not used, and the score is not "
    "calibrated for this site unless the deployment says so."
)


@dataclass(frozen=True)
class Score:
    """One scored record, as the card reports it."""

    task_title: str
    question: str
    p_yes: float | None
    """Probability of the positive answer; None when the model's answer gave none."""
    prediction_time: datetime | None
    events_total: int
    events_kept: int
    first_event: datetime | None
    last_event: datetime | None
    input_budget: int
    original_tokens: int
    medtpe_tokens: int
    compression_rate: float
    model: str
    mode: str
    artefact_id: str
    computed_at: datetime
    """When the model answered (UTC)."""
    mapping: Mapping[str, int] = field(default_factory=dict)
    """The FHIR → MEDS mapping's counts (resources read, codings mapped and not)."""
    receipt: Mapping[str, Any] | None = None
    """What the answer was derived from, as JSON values (`medtpe.ledger.answers.ReceiptBasis`'s
    `to_json`): each card shown on this score, from the cache too, is a ledger row on it; None
    with the ledger off."""


@dataclass(frozen=True)
class CardText:
    """A card's indicator, summary and Markdown detail."""

    indicator: Indicator
    summary: str
    detail: str


def card_text(score: Score, bands: RiskBands, *, cached: bool) -> CardText:
    """The card of a score; `cached`: the score was computed by an earlier call on the same
    record (the detail says when).

    >>> from datetime import datetime
    >>> s = Score("ICU mortality", "Will the patient die?", 0.4, None, 3, 3, None, None, 8192,
    ...           90, 60, 1 / 3, "m", "medtpe", "a1", datetime(2026, 1, 1))
    >>> card_text(s, RiskBands(warning=0.2, critical=0.5), cached=False).summary
    'ICU mortality: elevated risk (40%)'
    """
    if score.p_yes is None:
        summary = _summary(score.task_title, "no risk score (the model gave no answer)")
        return CardText(Indicator.INFO, summary, _detail(score, None, cached))
    band = bands.band(score.p_yes)
    summary = _summary(score.task_title, f"{band.name} risk ({score.p_yes:.0%})")
    return CardText(band.indicator, summary, _detail(score, band, cached))


def _summary(title: str, risk: str) -> str:
    """`title: risk`, the title shortened when the whole would reach the limit."""
    room = SUMMARY_LIMIT - 1 - len(risk) - 2
    if len(title) > room:
        title = title[: max(room - 1, 0)] + "…"
    return f"{title}: {risk}"


def _time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value is not None else "none"


def _detail(score: Score, band: Band | None, cached: bool) -> str:
    """The Markdown detail: one bold-labelled line per fact, then what the card does not show."""
    if score.p_yes is None or band is None:
        risk = "- **Probability:** none (no answer option in the model's first answer token)"
    else:
        risk = (
            f"- **Probability:** {score.p_yes:.2f} that the answer to “{score.question}” "
            f"is yes\n- **Risk band:** {band.describe()}"
        )
    left_out = score.events_total - score.events_kept
    window = (
        f"- **Data used:** {score.events_kept:,} of {score.events_total:,} events, recorded "
        f"{_time(score.first_event)} to {_time(score.last_event)}; prediction time "
        f"{_time(score.prediction_time)}"
    )
    if left_out:
        window += (
            f" ({left_out:,} older events left out: the input budget is "
            f"{score.input_budget:,} tokens)"
        )
    lines = [risk, window]
    if score.mapping:
        counts = ", ".join(f"{name.replace('_', ' ')} {n:,}" for name, n in score.mapping.items())
        lines.append(f"- **FHIR mapping:** {counts}")
    lines += [
        f"- **Model:** {score.model} ({score.mode} mode), artefact `{score.artefact_id}`",
        f"- **Compression:** {score.original_tokens:,} → {score.medtpe_tokens:,} prompt tokens "
        f"({score.compression_rate:.1%} fewer)",
        f"- **Computed:** {score.computed_at.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        + (" (an earlier call's score: the record has not changed since)" if cached else ""),
        "",
        NOT_SHOWN,
    ]
    return "\n".join(lines)
