"""RoPE's slow dimensions stretched: a MedTPE prompt read with its distant tokens about as far apart
as the original prompt's, its neighbours as close as trained.

A MedTPE prompt is about half as long as the original, so its answer sits at about half the
position and every distant token about half as far: the model reads a 4,096-token record as a
2,048-token one, and the answer's probability moves (docs/benchmarks.md, Fidelity). Stretching
every position alike breaks the local order the model reads; stretching only RoPE's slow
(long-wavelength) dimensions is YaRN's by-parts rule with a factor below 1 — a `rope_parameters`
entry of a checkpoint's `config.json` that Hugging Face models and stock vLLM both read.

>>> stretched_rope({"rope_theta": 100000.0, "rope_type": "default"}, 8192, 2.0)["factor"]
0.5
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PLAIN_ROPE = "default"
STRETCHED_ROPE = "yarn"


def stretched_rope(
    rope_parameters: Mapping[str, Any], max_position_embeddings: int, stretch: float
) -> dict[str, Any]:
    """`rope_parameters` (a config's, plain RoPE) with its slow dimensions stretched by `stretch`
    (> 1): YaRN with factor 1/stretch over the model's own context as its original length (its
    fastest dimensions as trained, a ramp, the slowest × stretch; attention scale 1)."""
    if stretch <= 1:
        raise ValueError(f"rope stretch: expected more than 1, not {stretch}")
    kind = rope_parameters.get("rope_type", PLAIN_ROPE)
    if kind != PLAIN_ROPE:
        raise ValueError(f"rope stretch: the model's RoPE is already {kind!r}, not plain")
    return {
        **rope_parameters,
        "rope_type": STRETCHED_ROPE,
        "factor": 1 / stretch,
        "original_max_position_embeddings": max_position_embeddings,
    }
