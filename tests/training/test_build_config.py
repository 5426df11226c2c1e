"""Build settings that cannot work together are refused by name before any step runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from medtpe.training.build_config import BuildConfigError, build_config

PATHS = {"base": Path("base"), "meds": Path("meds"), "out": Path("out"), "length_mix": [8192]}


def test_ssft_after_a_stretched_distillation_is_refused() -> None:
    """SSFT reads plain RoPE: rows distilled to be read stretched would be trained otherwise."""
    stretched = {"rope_stretch": 1.88}
    assert build_config(None, PATHS | {"distill": stretched, "losses": []}).distill.rope_stretch
    assert build_config(None, PATHS | {"distill": {}, "losses": ["ce"]}).losses == ("ce",)
    with pytest.raises(BuildConfigError, match=r"'losses'.*RoPE stretch"):
        build_config(None, PATHS | {"distill": stretched, "losses": ["ce"]})


@pytest.mark.parametrize(
    ("setting", "value"),
    [("plain_tail", -1), ("ray_address", ""), ("workers", 2)],
)
def test_out_of_range_settings_are_refused_by_name(setting: str, value: object) -> None:
    """Each check runs (the Ray ones sat unreachable after a `return` until 2026-11-27)."""
    extra = {"ray_address": "local"} if setting == "workers" else {}
    with pytest.raises(BuildConfigError, match=f"'{setting}'"):
        build_config(None, PATHS | extra | {setting: value})
    assert build_config(None, PATHS | {"plain_tail": 256}).plain_tail == 256
