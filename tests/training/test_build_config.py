"""Build settings that cannot work together are refused by name before any step runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.build_config import BuildConfigError, build_config

PATHS = {"base": Path("base"), "meds": Path("meds"), "out": Path("out"), "length_mix": [8192]}


def test_ssft_after_a_stretched_distillation_is_refused() -> None:
    """SSFT reads plain RoPE: rows distilled to be read stretched would be trained otherwise."""
    stretched = {"rope_stretch": 1.88}
    assert build_config(None, PATHS | {"distill": stretched, "losses": []}).distill.rope_stretch
    assert build_config(None, PATHS | {"distill": {}, "losses": ["ce"]}).losses == ("ce",)
    with pytest.raises(BuildConfigError, match=r"'losses'.*RoPE stretch"):
        build_config(None, PATHS | {"distill": stretched, "losses": ["ce"]})
