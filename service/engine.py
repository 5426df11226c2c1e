"""The vLLM engine wrapper shared by the service and the offline evaluation runner.

Prompts go in as token ids (`TokensPrompt`), so the caller's tokenizer (MedTPE or the base one)
decides the segmentation; answers come back as token ids, decoded by the same tokenizer. vLLM's
own detokenizer is skipped. On request, each answer also carries the top-k log-probabilities of
its first generated token, by token id.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm import CompletionOutput, SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

logger = logging.getLogger(__name__)

GIB = 1024**3


class EngineDead(RuntimeError):
    """The engine process died; the engine cannot serve any more requests."""


@dataclass(frozen=True)
class EngineConfig:
    """What the engine loads and how much it may hold."""

    model_dir: Path
    max_model_len: int | None = None
    """Context length (prompt + answer); None: the model's own limit."""
    max_num_seqs: int = 16
    """Sequences the scheduler runs in one batch."""
    kv_cache_gib: float | None = None
    """KV cache size; None: vLLM's default for the device."""
    seed: int = 0
    enforce_eager: bool = False
    """Skip torch.compile: starts about a minute sooner on CPU, decodes about 2x slower."""
    enable_prefix_caching: bool | None = None
    """None: vLLM's default (on); off for measurements where every prompt must pay its prefill."""


@dataclass(frozen=True)
class Completion:
    """One generated answer."""

    ids: list[int]
    """Its token ids, without the EOS / stop token that ended it."""
    first_logprobs: dict[int, float] | None = None
    """Top-k log-probabilities of the first generated token by token id, when asked for (the
    model's raw distribution, before temperature); None otherwise or when nothing was generated."""


def _completion(output: CompletionOutput, top_k: int | None) -> Completion:
    """An engine output as a `Completion`: stop token dropped, first-token top-k logprobs kept
    (vLLM adds the sampled token to the top k; it is left out unless it ranks within them)."""
    ids = list(output.token_ids)
    if output.finish_reason == "stop" and ids:
        ids.pop()
    first = None
    if top_k and output.logprobs:
        first = {
            token_id: entry.logprob
            for token_id, entry in output.logprobs[0].items()
            if entry.rank is None or entry.rank <= top_k
        }
    return Completion(ids, first)


def model_context_length(model_dir: Path) -> int | None:
    """`max_position_embeddings` of a Hugging Face checkpoint, if its config declares one."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    value = config.get("max_position_embeddings")
    return int(value) if value else None


class GenerationEngine:
    """An `AsyncLLM` with a token-ids-in, token-ids-out interface and death detection."""

    def __init__(self, llm: AsyncLLM, config: EngineConfig) -> None:
        self._llm = llm
        self.config = config
        self.max_model_len: int = llm.model_config.max_model_len
        self._dead = False

    @classmethod
    def start(cls, config: EngineConfig) -> GenerationEngine:
        """Start the engine (blocking, about 30 s on CPU; run it off the event loop)."""
        args = AsyncEngineArgs(
            model=str(config.model_dir),
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
            kv_cache_memory_bytes=int(config.kv_cache_gib * GIB) if config.kv_cache_gib else None,
            seed=config.seed,
            disable_log_stats=True,
            enforce_eager=config.enforce_eager,
            enable_prefix_caching=config.enable_prefix_caching,
        )
        logger.info("starting vLLM engine on %s", config.model_dir)
        return cls(AsyncLLM.from_engine_args(args), config)

    @property
    def dead(self) -> bool:
        """True once the engine process has died or its output loop has stopped."""
        if not self._dead and self._llm.errored:
            self._dead = True
        return self._dead

    async def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        n: int = 1,
        temperature: float = 0.0,
        max_new_tokens: int = 64,
        seed: int | None = None,
        top_logprobs: int | None = None,
    ) -> list[Completion]:
        """Generate `n` answers to one prompt (stop token excluded); with `top_logprobs` = k,
        each carries the top-k log-probabilities of its first token.

        Raises `EngineDead` when the engine is dead. Cancelling the caller (e.g. a timeout)
        aborts the request inside the engine.
        """
        if self.dead:
            raise EngineDead("the engine is dead")
        params = SamplingParams(
            n=n,
            temperature=temperature,
            max_tokens=max_new_tokens,
            seed=seed,
            detokenize=False,
            logprobs=top_logprobs,
        )
        # with n > 1 the streamed outputs carry the completions separately: keep the latest
        # (cumulative) state of each completion index
        completions: dict[int, CompletionOutput] = {}
        try:
            async for output in self._llm.generate(
                TokensPrompt(prompt_token_ids=list(prompt_ids)), params, uuid.uuid4().hex
            ):
                completions.update((c.index, c) for c in output.outputs)
        except EngineDeadError as exc:
            self._dead = True
            raise EngineDead("the engine died during generation") from exc
        except EngineGenerateError as exc:
            if self.dead:
                raise EngineDead("the engine died during generation") from exc
            raise
        if not completions:  # pragma: no cover - vLLM always yields a final output
            raise RuntimeError("the engine returned no output")
        return [_completion(completions[i], top_logprobs) for i in sorted(completions)]

    async def warm_up(self, prompt_ids: Sequence[int]) -> None:
        """One short generation, so the first real request does not pay the start-up costs."""
        await self.generate(prompt_ids, max_new_tokens=2)

    def shutdown(self) -> None:
        """Stop the engine process."""
        self._llm.shutdown()
