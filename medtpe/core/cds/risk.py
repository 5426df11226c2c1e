"""Risk bands: a predicted probability to a card's indicator (`info`, `warning`, `critical`).

A task's bands are two thresholds on the probability of the positive answer: at or above
`warning` the card is a warning, at or above `critical` it is critical, below both it is
informational. Deployments set them per task (`MEDTPE_CDS_RISK_BANDS`); the defaults below are
starting points near the tasks' base rates in MIMIC-IV, not calibrated cut-offs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Indicator(StrEnum):
    """A card's urgency (CDS Hooks 2.0), in increasing order."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


BAND_NAMES = {Indicator.INFO: "low", Indicator.WARNING: "elevated", Indicator.CRITICAL: "high"}
"""How a card names each band in its text."""


class RiskBands(BaseModel):
    """The thresholds of one task: `0 <= warning <= critical <= 1`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    warning: float = Field(ge=0.0, le=1.0, description="Lowest probability shown as a warning.")
    critical: float = Field(ge=0.0, le=1.0, description="Lowest probability shown as critical.")

    @model_validator(mode="after")
    def _ordered(self) -> RiskBands:
        if self.warning > self.critical:
            raise ValueError(f"warning ({self.warning}) must not exceed critical ({self.critical})")
        return self

    def band(self, probability: float) -> Band:
        """The band a probability falls in.

        >>> RiskBands(warning=0.2, critical=0.5).band(0.3).indicator
        <Indicator.WARNING: 'warning'>
        """
        if probability >= self.critical:
            return Band(Indicator.CRITICAL, self.critical, None)
        if probability >= self.warning:
            return Band(Indicator.WARNING, self.warning, self.critical)
        return Band(Indicator.INFO, 0.0, self.warning)

    def flagged_from(self, threshold: float) -> RiskBands:
        """These bands with `warning` at an operating threshold (a site's: the card is a warning
        or critical exactly when the prediction is flagged), `critical` raised to it if below.

        >>> RiskBands(warning=0.2, critical=0.5).flagged_from(0.6)
        RiskBands(warning=0.6, critical=0.6)
        """
        return RiskBands(warning=threshold, critical=max(self.critical, threshold))


@dataclass(frozen=True)
class Band:
    """A band: its indicator and the probabilities it covers, `[low, high)` (high None: up to 1)."""

    indicator: Indicator
    low: float
    high: float | None

    @property
    def name(self) -> str:
        """`low`, `elevated` or `high`."""
        return BAND_NAMES[self.indicator]

    def describe(self) -> str:
        """The band's range in words, e.g. `elevated (0.20 to below 0.50)`."""
        if self.high is None:
            return f"{self.name} ({self.low:.2f} or more)"
        return f"{self.name} ({self.low:.2f} to below {self.high:.2f})"


DEFAULT_BANDS = RiskBands(warning=0.2, critical=0.5)
"""Bands of a task without its own."""
DEFAULT_TASK_BANDS: dict[str, RiskBands] = {
    "icu_mortality": RiskBands(warning=0.15, critical=0.35),
    "readmission_30d": RiskBands(warning=0.2, critical=0.4),
}
"""The default bands per task (`MEDTPE_CDS_RISK_BANDS` replaces them)."""
