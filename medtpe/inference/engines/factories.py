"""Where the program gets its real engine: `EngineFactory`s that start vLLM or connect to a vLLM
engine core another process started. Imported where the program is assembled (the CLI, the app
factory, the evaluation runner, the build's gate, the batch job); vLLM itself is imported only
when an engine starts, so importing this module stays light.
"""

from __future__ import annotations

from typing import Any

from medtpe.inference.engines.protocol import Engine, EngineConfig, EngineFactory


def start_vllm(config: EngineConfig) -> Engine:
    """The real engine: vLLM in this process (`medtpe.inference.engines.vllm_engine.VllmEngine`)."""
    from medtpe.inference.engines.vllm_engine import VllmEngine

    return VllmEngine.start(config)


def connect_vllm(client: dict[str, Any]) -> EngineFactory:
    """An `EngineFactory` that connects to a vLLM engine core another process started
    (`medtpe.inference.engines.shared`); `client` is the addresses that process handed this one."""

    def connect(config: EngineConfig) -> Engine:
        from medtpe.inference.engines.vllm_engine import VllmEngine

        return VllmEngine.connect(client, config)

    return connect
