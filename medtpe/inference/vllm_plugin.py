"""vLLM general plugin (entry point `vllm.general_plugins`, loaded in every vLLM process): the
MedTPE tokenizer as `--tokenizer-mode medtpe`, and vLLM's default `hf`/`auto` mode extended to
pick it for any model directory that holds `medtpe.json` (`medtpe.inference.vllm_tokenizer`); and
the CPU engine's cores chosen as the project's own engines choose them
(`medtpe.inference.cpu_cores`); transformers' warnings about an export's RoPE stretch silenced
(`medtpe.core.rope_stretch.quiet_stretch_warnings`: stated so on purpose)."""

from __future__ import annotations

from medtpe.core.rope_stretch import quiet_stretch_warnings
from medtpe.inference.cpu_cores import bind_engine_cores, reserved_from_env

_TOKENIZER_MODULE = "medtpe.inference.vllm_tokenizer"


def register() -> None:
    """Register the MedTPE tokenizer and its renderer with vLLM (idempotent, imports nothing
    heavy: vLLM resolves the classes by name when a model is loaded)."""
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry

    # loaded before the engine core starts (in `vllm serve`'s front end and `vllm.LLM`'s
    # process): the CPU engine on every core of a small machine, as in the service; an engine
    # wrapper's or the operator's binding set earlier stands
    bind_engine_cores(reserved_from_env(), replace=False)
    quiet_stretch_warnings()  # before vLLM reads the export's config

    if TokenizerRegistry.tokenizers.get("medtpe") == (_TOKENIZER_MODULE, "MedTPEVllmTokenizer"):
        return
    TokenizerRegistry.register("medtpe", _TOKENIZER_MODULE, "MedTPEVllmTokenizer")
    TokenizerRegistry.register("hf", _TOKENIZER_MODULE, "MedTPEAutoTokenizer")
    RENDERER_REGISTRY.register("medtpe", "vllm.renderers.hf", "HfRenderer")
