"""`medtpe.inference.cpu_dtype`: `auto` is float32 on a CPU without native bfloat16, vLLM's choice
elsewhere, an explicit dtype always kept; every engine's arguments go through it, and an
engine reports the dtype vLLM resolved them to (never `auto`), which receipts record."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")

import torch

from medtpe.core.paths import default_model_dir
from medtpe.inference.cpu_dtype import (
    cpu_has_native_bfloat16,
    dtype_name,
    engine_dtype,
    resolved_dtype,
)
from medtpe.inference.engines.protocol import EngineConfig, EngineOptions
from medtpe.inference.engines.vllm_engine import engine_args


@pytest.mark.parametrize(
    ("requested", "on_cpu", "native", "expected"),
    [
        ("auto", True, False, "float32"),
        ("auto", True, True, "auto"),
        ("auto", False, False, "auto"),
        ("bfloat16", True, False, "bfloat16"),
        ("float16", False, True, "float16"),
        ("float32", False, True, "float32"),
    ],
)
def test_resolved_dtype(requested: str, on_cpu: bool, native: bool, expected: str) -> None:
    assert resolved_dtype(requested, on_cpu=on_cpu, native_bfloat16=native) == expected


def test_every_engine_runs_in_the_resolved_dtype(tmp_path: Path) -> None:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    assert cpu_has_native_bfloat16() == ("avx512_bf16" in flags or "amx_tile" in flags)
    config = EngineConfig(model_dir=tmp_path, max_model_len=512, options=EngineOptions())
    assert engine_args(config).dtype == engine_dtype("auto")
    explicit = EngineConfig(tmp_path, 512, EngineOptions(dtype="bfloat16"))
    assert engine_args(explicit).dtype == "bfloat16"


def test_the_dtype_an_engine_runs_in_is_what_auto_resolves_to(
    service_files: tuple[Path, Path],
) -> None:
    """vLLM's configuration of the default model (what `VllmEngine` reads its `dtype` from,
    no engine started): `auto` runs in bfloat16 on a CPU with native bfloat16, else float32."""
    expected = "bfloat16" if cpu_has_native_bfloat16() else "float32"
    for requested, ran in (("auto", expected), ("float32", "float32"), ("bfloat16", "bfloat16")):
        config = EngineConfig(default_model_dir(), 512, EngineOptions(dtype=requested))
        assert dtype_name(engine_args(config).create_model_config().dtype) == ran
    assert [dtype_name(d) for d in (torch.float32, torch.bfloat16, torch.float16)] == [
        "float32",
        "bfloat16",
        "float16",
    ]
    with pytest.raises(ValueError, match="no dtype option names"):
        dtype_name(torch.float64)
