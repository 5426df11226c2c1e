"""Greedy answers from a model directory with the vLLM engine (offline batch).

The engine runs in a child Python process (`python -m training.pseudo_labels IN OUT`): vLLM
spawns its engine core, which needs an importable `__main__` guard, and keeping it out of the
training process frees its memory (model weights, KV cache) before training starts. The caller
passes token ids, so each tokenizer's exact encoding reaches the engine unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

DEFAULT_KVCACHE_GIB = "2"
SMALL_MACHINE_CORES = 4


def _cpu_engine_defaults() -> dict[str, str]:
    """CPU-backend settings unless the environment sets them: a small KV cache and, on machines
    with at most 4 cores, OpenMP threads on every core (vLLM's default reserves one core for
    itself, which halves the speed on 2 cores). The GPU backend ignores them."""
    defaults = {"VLLM_CPU_KVCACHE_SPACE": DEFAULT_KVCACHE_GIB}
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= SMALL_MACHINE_CORES:
        bind = ",".join(map(str, cores))
        defaults |= {"VLLM_CPU_OMP_THREADS_BIND": bind, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    return defaults


def greedy_generate(
    model_dir: Path,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    max_model_len: int,
) -> list[list[int]]:
    """Greedy completion token ids of each prompt's token ids, as the engine returns them: a
    completion that stopped on the model's end-of-sequence token ends with it."""
    with tempfile.TemporaryDirectory(prefix="medtpe-generate-") as tmp:
        request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request.write_text(
            json.dumps(
                {
                    "model_dir": str(model_dir),
                    "prompts": [list(map(int, p)) for p in prompts],
                    "max_new_tokens": max_new_tokens,
                    "max_model_len": max_model_len,
                }
            )
        )
        env = {**_cpu_engine_defaults(), **os.environ}
        subprocess.run(
            [sys.executable, "-m", "training.pseudo_labels", str(request), str(result)],
            check=True,
            env=env,
        )
        return json.loads(result.read_text())["completions"]


def _generate_in_process(request: dict) -> list[list[int]]:
    """Run the vLLM engine on a request (only called in the child process)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=request["model_dir"],
        max_model_len=request["max_model_len"],
        seed=1,
        enable_prefix_caching=False,
        enforce_eager=True,  # skips torch.compile: engine ready in seconds, not minutes, on CPU
    )
    params = SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"])
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in request["prompts"]], params)
    return [list(output.outputs[0].token_ids) for output in outputs]


def main(argv: Sequence[str]) -> None:
    """Child-process entry: read the request JSON, write `{"completions": [...]}`."""
    request_path, result_path = argv
    request = json.loads(Path(request_path).read_text())
    completions = _generate_in_process(request)
    Path(result_path).write_text(json.dumps({"completions": completions}))


if __name__ == "__main__":
    main(sys.argv[1:])
