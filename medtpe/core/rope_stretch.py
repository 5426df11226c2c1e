"""RoPE's slow dimensions stretched: a MedTPE prompt read with its distant tokens about as far apart
as the original prompt's, its neighbours as close as trained.

A MedTPE prompt is about half as long as the original, so its answer sits at about half the
position and every distant token about half as far: the model reads a 4,096-token record as a
2,048-token one, and the answer's probability moves (docs/benchmarks.md, Fidelity). Stretching
every position alike breaks the local order the model reads; stretching only RoPE's slow
(long-wavelength) dimensions is YaRN's by-parts rule with a factor below 1 — a `rope_parameters`
entry of a checkpoint's `config.json` that Hugging Face models and stock vLLM both read.

YaRN's ramp between the two kinds of dimensions depends only on (original length / beta_fast,
original length / beta_slow), while vLLM's YaRN caches cos/sin for `original length × factor`
positions and reads past them out of bounds (with factor 1/1.88 over 8,192: 4,358 positions, so
an 8,192-budget MedTPE prompt's last positions were garbage). So the entry states the original
length and both betas × the smallest power of two ≥ the stretch: the same ramp to the bit (the
quotients are exact), a cache over the model's whole context.

>>> entry = stretched_rope({"rope_theta": 100000.0, "rope_type": "default"}, 8192, 1.88)
>>> entry["original_max_position_embeddings"], entry["beta_fast"], entry["beta_slow"]
(16384, 64, 2)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

PLAIN_ROPE = "default"
STRETCHED_ROPE = "yarn"
YARN_BETA_FAST = 32
YARN_BETA_SLOW = 1
"""YaRN's defaults (transformers, vLLM): the ramp's ends, in rotations over the original length."""


def stretched_rope(
    rope_parameters: Mapping[str, Any], max_position_embeddings: int, stretch: float
) -> dict[str, Any]:
    """`rope_parameters` (a config's, plain RoPE) with its slow dimensions stretched by `stretch`
    (> 1): YaRN with factor 1/stretch and the ramp of the model's own context as its original
    length (its fastest dimensions as trained, a ramp, the slowest × stretch; attention scale 1),
    stated so that vLLM's cache covers that context (module docstring)."""
    if stretch <= 1:
        raise ValueError(f"rope stretch: expected more than 1, not {stretch}")
    kind = rope_parameters.get("rope_type", PLAIN_ROPE)
    if kind != PLAIN_ROPE:
        raise ValueError(f"rope stretch: the model's RoPE is already {kind!r}, not plain")
    span = 2 ** math.ceil(math.log2(stretch))
    return {
        **rope_parameters,
        "rope_type": STRETCHED_ROPE,
        "factor": 1 / stretch,
        "original_max_position_embeddings": max_position_embeddings * span,
        "beta_fast": YARN_BETA_FAST * span,
        "beta_slow": YARN_BETA_SLOW * span,
    }


TRANSFORMERS_ROPE_LOGGER = "transformers.modeling_rope_utils"
STRETCH_WARNINGS = (
    "`rope_parameters`'s factor field must be a float or int >= 1, got 0.",
    "The explicitly set RoPE scaling factor (config.rope_parameters['factor'] = 0.",
)
"""What transformers warns of a stretched entry at every load of its config: a YaRN factor below
1, and an original length that does not imply it; both stated so on purpose (module docstring),
and read as stated by transformers and vLLM."""


class StretchWarningFilter(logging.Filter):
    """Drops transformers' warnings about a stretched entry's factor below 1 (`STRETCH_WARNINGS`);
    a factor of 1 or more, and every other warning, pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a stretch warning."""
        return not record.getMessage().startswith(STRETCH_WARNINGS)


def quiet_stretch_warnings() -> None:
    """Install `StretchWarningFilter` on transformers' RoPE logger (once per process)."""
    logger = logging.getLogger(TRANSFORMERS_ROPE_LOGGER)
    if not any(isinstance(f, StretchWarningFilter) for f in logger.filters):
        logger.addFilter(StretchWarningFilter())
