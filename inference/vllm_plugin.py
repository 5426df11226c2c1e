"""vLLM general plugin (entry point `vllm.general_plugins`, loaded in every vLLM process): the
MedTPE tokenizer as `--tokenizer-mode medtpe`, and vLLM's default `hf`/`auto` mode extended to
pick it for any model directory that holds `medtpe.json` (`inference.vllm_tokenizer`)."""

from __future__ import annotations

_TOKENIZER_MODULE = "inference.vllm_tokenizer"


def register() -> None:
    """Register the MedTPE tokenizer and its renderer with vLLM (idempotent, imports nothing
    heavy: vLLM resolves the classes by name when a model is loaded)."""
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry

    if TokenizerRegistry.tokenizers.get("medtpe") == (_TOKENIZER_MODULE, "MedTPEVllmTokenizer"):
        return
    TokenizerRegistry.register("medtpe", _TOKENIZER_MODULE, "MedTPEVllmTokenizer")
    TokenizerRegistry.register("hf", _TOKENIZER_MODULE, "MedTPEAutoTokenizer")
    RENDERER_REGISTRY.register("medtpe", "vllm.renderers.hf", "HfRenderer")
