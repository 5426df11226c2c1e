"""Greedy answers from a model directory with the vLLM engine (offline batch), through the
service's engine wrapper (`medtpe.inference.engines.vllm_engine.VllmEngine`) and its stop rule.

The engine runs in a child Python process (`python -m medtpe.training.pseudo_labels IN OUT`): vLLM
spawns its engine core, which needs an importable `__main__` guard, and keeping it out of the
training process frees its memory (model weights, KV cache) before training starts. The caller
passes token ids, so each tokenizer's exact encoding reaches the engine unchanged.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from medtpe.inference.engines.protocol import (
    EngineConfig,
    EngineOptions,
    Finish,
    GenerationParams,
)

BUILD_KV_CACHE_GIB = 2.0
"""KV cache of a build's engines (pseudo-labelling, the fidelity gate): they run between training
steps on the same machine, so they take half of serving's default (`EngineOptions.kv_cache_gib`)."""


def greedy_generate(
    model_dir: Path,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    max_model_len: int,
    *,
    stop_ids: frozenset[int] = frozenset(),
    eos_id: int | None = None,
) -> list[list[int]]:
    """Greedy completion token ids of each prompt's token ids, each ending at the first of
    `stop_ids` (kept: the stop rule of serving); a completion the model ended itself ends with
    `eos_id` (when given), so an answer learnt from it ends where the model's does."""
    with tempfile.TemporaryDirectory(prefix="medtpe-generate-") as tmp:
        request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request.write_text(
            json.dumps(
                {
                    "model_dir": str(model_dir),
                    "prompts": [list(map(int, p)) for p in prompts],
                    "max_new_tokens": max_new_tokens,
                    "max_model_len": max_model_len,
                    "stop_ids": sorted(stop_ids),
                    "eos_id": eos_id,
                }
            )
        )
        # the engine's cores: chosen by the engine wrapper (`medtpe.inference.cpu_cores`)
        subprocess.run(
            [sys.executable, "-m", "medtpe.training.pseudo_labels", str(request), str(result)],
            check=True,
        )
        return json.loads(result.read_text())["completions"]


async def _generate_all(request: dict) -> list[list[int]]:
    """Every prompt of a request through one `VllmEngine` (only called in the child process)."""
    from medtpe.inference.engines.vllm_engine import VllmEngine

    options = EngineOptions(
        kv_cache_gib=BUILD_KV_CACHE_GIB,  # beside training: smaller than serving's default
        enable_prefix_caching=False,
        enforce_eager=True,  # skips torch.compile: engine ready in seconds, not minutes, on CPU
        log_stats=False,
    )
    config = EngineConfig(Path(request["model_dir"]), request["max_model_len"], options)
    engine = VllmEngine.start(config)
    params = GenerationParams(
        max_new_tokens=request["max_new_tokens"], stop_ids=frozenset(request["stop_ids"])
    )
    try:
        outputs = await asyncio.gather(*(engine.generate(p, params) for p in request["prompts"]))
    finally:
        engine.shutdown()
    eos = request["eos_id"]
    return [
        [*c.ids, eos] if c.finish is Finish.EOS and eos is not None else c.ids for [c] in outputs
    ]


def main(argv: Sequence[str]) -> None:
    """Child-process entry: read the request JSON, write `{"completions": [...]}`."""
    request_path, result_path = argv
    request = json.loads(Path(request_path).read_text())
    completions = asyncio.run(_generate_all(request))
    Path(result_path).write_text(json.dumps({"completions": completions}))


if __name__ == "__main__":
    main(sys.argv[1:])
