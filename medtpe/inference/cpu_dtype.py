"""The CPU engine's dtype: float32 where the CPU computes bfloat16 without native instructions.

vLLM's CPU backend runs a model in bfloat16 under `dtype=auto`, even a float32 checkpoint. On a
CPU without AVX-512 BF16 or AMX (e.g. AVX2-only AMD EPYC machines) bfloat16 is emulated: the
service's `/predict` at 8,192 tokens took 3.0x (MedTPE) and 2.4x (original) as long in bfloat16
as in float32, same answers (docs/benchmarks.md, "Float32 on CPUs without bfloat16"); bfloat16
also moves an answer's probability in steps of about 0.03 near p = 0.8.
So `auto` here means float32 on such a CPU, vLLM's choice anywhere else (a GPU, a CPU with
native bfloat16); an explicit dtype is always kept.

Example: `resolved_dtype("auto", on_cpu=True, native_bfloat16=False)` -> `"float32"`. What an
engine runs in once started is vLLM's resolved `model_config.dtype` (`dtype_name`): `auto` left
to vLLM is bfloat16 on a CPU with native bfloat16 (a float32 checkpoint is cast down).
"""

from __future__ import annotations

import torch
from vllm.platforms import current_platform

from medtpe.inference.engines.protocol import Dtype

FLOAT32: Dtype = "float32"
_NAMES: dict[torch.dtype, Dtype] = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}


def resolved_dtype(requested: Dtype, *, on_cpu: bool, native_bfloat16: bool) -> Dtype:
    """The dtype an engine runs in: `requested`, except `auto` on a CPU without native
    bfloat16, which is float32 (module docstring)."""
    if requested == "auto" and on_cpu and not native_bfloat16:
        return FLOAT32
    return requested


def engine_dtype(requested: Dtype) -> Dtype:
    """`resolved_dtype` for this machine's platform and CPU."""
    return resolved_dtype(
        requested,
        on_cpu=current_platform.is_cpu(),
        native_bfloat16=cpu_has_native_bfloat16(),
    )


def cpu_has_native_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX-512 BF16 or AMX tiles)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def dtype_name(dtype: torch.dtype) -> Dtype:
    """The name of the dtype a started engine runs in (vLLM's resolved `model_config.dtype`);
    a ValueError for one no option names."""
    try:
        return _NAMES[dtype]
    except KeyError:
        raise ValueError(f"the engine runs in {dtype}, which no dtype option names") from None
