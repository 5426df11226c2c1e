"""The vLLM engine behind `medtpe.inference.engines.protocol.Engine`.

Prompts go in as token ids (`TokensPrompt`), so the caller's tokenizer (MedTPE or the base one)
decides the segmentation; answers come back as token ids, decoded by the same tokenizer. vLLM's
own detokenizer is skipped. On request, each answer also carries the top-k log-probabilities of
its first generated token, by token id.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from vllm import CompletionOutput, SamplingParams
from vllm.config import VllmConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.sampling_params import StructuredOutputsParams
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from medtpe.inference.cpu_cores import bind_engine_cores, reserved_from_env
from medtpe.inference.cpu_dtype import dtype_name, engine_dtype
from medtpe.inference.engines.protocol import (
    AnswerConstraint,
    Completion,
    Dtype,
    EngineConfig,
    EngineDead,
    EngineOptions,
    Finish,
    GenerationParams,
)

logger = logging.getLogger(__name__)

GIB = 1024**3


def _completion(
    output: CompletionOutput, top_k: int | None, stop_ids: frozenset[int], cached_tokens: int
) -> Completion:
    """An engine output as a `Completion`: the end-of-sequence token dropped, a stop id of the
    caller's stop rule kept (vLLM's `stop_reason` is the id that stopped it; the model's own
    extra end-of-sequence ids from its generation config stop that way too, and are dropped),
    each position's top-k logprobs kept (vLLM adds the sampled token to the top k; it is left
    out unless it ranks within them); `cached_tokens` is the request's prefix-cache hit."""
    ids = list(output.token_ids)
    if output.finish_reason != "stop":
        finish = Finish.LENGTH
    elif output.stop_reason in stop_ids:
        finish = Finish.STOP
    else:
        finish = Finish.EOS
        if ids:
            ids.pop()
    logprobs = None
    if top_k and output.logprobs:
        logprobs = [
            {
                token_id: entry.logprob
                for token_id, entry in position.items()
                if entry.rank is None or entry.rank <= top_k
            }
            for position in output.logprobs
        ]
    return Completion(ids, logprobs, finish, cached_tokens)


def structured_outputs(constraint: AnswerConstraint | None) -> StructuredOutputsParams | None:
    """vLLM's structured-output parameters for a constraint (None: free decoding)."""
    if constraint is None:
        return None
    return StructuredOutputsParams(
        regex=constraint.regex,
        choice=list(constraint.choice) if constraint.choice is not None else None,
        json=constraint.json_schema,
    )


def engine_args(config: EngineConfig) -> AsyncEngineArgs:
    """vLLM's engine arguments for `config`: model, context, batch, KV cache, parallelism, stats."""
    options = config.options
    kv_bytes = int(options.kv_cache_gib * GIB) if options.kv_cache_gib else None
    return AsyncEngineArgs(
        model=str(config.model_dir),
        max_model_len=config.max_model_len,
        max_num_seqs=options.max_num_seqs,
        kv_cache_memory_bytes=kv_bytes,
        seed=options.seed,
        dtype=engine_dtype(options.dtype),
        disable_log_stats=not options.log_stats,
        enforce_eager=options.enforce_eager,
        enable_prefix_caching=options.enable_prefix_caching,
        tensor_parallel_size=options.tensor_parallel_size,
        pipeline_parallel_size=options.pipeline_parallel_size,
        distributed_executor_backend=options.distributed_executor_backend,
    )


def bind_cpu_cores(options: EngineOptions) -> None:
    """Choose the CPU engine's cores before an engine core starts (`medtpe.inference.cpu_cores`):
    `options.cpu_reserved_cores`, else `MEDTPE_CPU_RESERVED_CORES`; every core on a small
    machine. Every engine start goes through here (`VllmEngine.start`, the shared engine core)."""
    reserved = options.cpu_reserved_cores
    if reserved is None:
        reserved = reserved_from_env()
    workers = options.tensor_parallel_size * options.pipeline_parallel_size
    written = bind_engine_cores(reserved, workers)
    if written:
        logger.info("CPU engine cores: %s", written)


def client_vllm_config(config: EngineConfig, n_processes: int, rank: int) -> VllmConfig:
    """vLLM's configuration of `config` for API process `rank` of `n_processes` sharing one
    engine core (rank -1: the process that launches the core)."""
    args = engine_args(config)
    args._api_process_count = n_processes
    args._api_process_rank = rank
    return args.create_engine_config(UsageContext.OPENAI_API_SERVER)


class _AsyncLLM(AsyncLLM):
    """vLLM's `AsyncLLM`, shut down once. `VllmEngine.shutdown` shuts it down; vLLM's
    `__del__` shuts it down again when the object is collected, which for an engine freed only
    at interpreter exit runs after the modules' globals are gone: a `TypeError: 'NoneType'
    object is not callable` traceback on every command's way out."""

    _shut_down = False

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the engine core and the output handler, the first time only."""
        if self._shut_down:
            return
        self._shut_down = True
        super().shutdown(timeout)


class VllmEngine:
    """An `AsyncLLM` with a token-ids-in, token-ids-out interface and death detection."""

    def __init__(self, llm: AsyncLLM, config: EngineConfig) -> None:
        self._llm = llm
        self.config = config
        self.max_model_len: int = llm.model_config.max_model_len
        self.dtype: Dtype = dtype_name(llm.model_config.dtype)
        self._dead = False

    @classmethod
    def start(cls, config: EngineConfig) -> VllmEngine:
        """Start the engine (blocking, about 30 s on CPU; run it off the event loop)."""
        logger.info("starting vLLM engine on %s", config.model_dir)
        bind_cpu_cores(config.options)
        return cls(_AsyncLLM.from_engine_args(engine_args(config)), config)

    @classmethod
    def connect(cls, client: dict[str, Any], config: EngineConfig) -> VllmEngine:
        """A client of an engine core already started by `medtpe.inference.engines.shared`
        (blocking): `client` is the address set that process handed this API process."""
        addresses = dict(client)
        addresses.pop("api_server_loads", None)  # vLLM's own least-loaded accept: not used
        count, index = addresses.pop("client_count"), addresses.pop("client_index")
        logger.info("connecting API process %d of %d to the engine core", index, count)
        llm = _AsyncLLM.from_vllm_config(
            client_vllm_config(config, count, index),
            disable_log_stats=not config.options.log_stats,
            client_addresses=addresses,
            client_count=count,
            client_index=index,
        )
        return cls(llm, config)

    @property
    def dead(self) -> bool:
        """True once the engine process has died or its output loop has stopped."""
        if not self._dead and self._llm.errored:
            self._dead = True
        return self._dead

    async def generate(
        self, prompt_ids: Sequence[int], params: GenerationParams
    ) -> list[Completion]:
        """Generate `params.n` answers to one prompt (end-of-sequence token excluded); with
        `top_logprobs` = k, each carries every position's top-k log-probabilities; with a
        `constraint`, decoding is restricted to text that matches it (vLLM structured outputs);
        generation stops at the first of `stop_ids` (vLLM `stop_token_ids`, checked by the engine
        on each sampled id, so it holds for any tokenizer's ids). Prompts with different
        `cache_salt`s never share prefix-cache blocks (vLLM salts the first block's hash).

        Raises `EngineDead` when the engine is dead. Cancelling the caller (e.g. a timeout)
        aborts the request inside the engine.
        """
        if self.dead:
            raise EngineDead("the engine is dead")
        sampling = SamplingParams(
            n=params.n,
            temperature=params.temperature,
            max_tokens=params.max_new_tokens,
            seed=params.seed,
            detokenize=False,
            logprobs=params.top_logprobs,
            structured_outputs=structured_outputs(params.constraint),
            stop_token_ids=sorted(params.stop_ids),
        )
        # with n > 1 the streamed outputs carry the completions separately: keep the latest
        # (cumulative) state of each completion index
        completions: dict[int, CompletionOutput] = {}
        cached_tokens = 0  # known once the prefill is done (vLLM: None before)
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        if params.cache_salt is not None:
            prompt["cache_salt"] = params.cache_salt
        try:
            async for output in self._llm.generate(prompt, sampling, uuid.uuid4().hex):
                completions.update((c.index, c) for c in output.outputs)
                cached_tokens = output.num_cached_tokens or cached_tokens
        except EngineDeadError as exc:
            self._dead = True
            raise EngineDead("the engine died during generation") from exc
        except EngineGenerateError as exc:
            if self.dead:
                raise EngineDead("the engine died during generation") from exc
            raise
        if not completions:  # pragma: no cover - vLLM always yields a final output
            raise RuntimeError("the engine returned no output")
        return [
            _completion(completions[i], params.top_logprobs, params.stop_ids, cached_tokens)
            for i in sorted(completions)
        ]

    async def warm_up(self, prompt_ids: Sequence[int]) -> None:
        """One short generation, so the first real request does not pay the start-up costs."""
        await self.generate(prompt_ids, GenerationParams(max_new_tokens=2))

    async def prefill(self, prompt_ids: Sequence[int], cache_salt: str | None = None) -> None:
        """A one-token generation of `prompt_ids`: vLLM keeps its full blocks in the prefix
        cache (nothing when prefix caching is off)."""
        if self.config.options.enable_prefix_caching is not False:
            params = GenerationParams(max_new_tokens=1, cache_salt=cache_salt)
            await self.generate(prompt_ids, params)

    def shutdown(self) -> None:
        """Stop the engine process (again: nothing)."""
        self._llm.shutdown()
