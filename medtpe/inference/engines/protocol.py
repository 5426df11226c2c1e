"""The engine interface: token ids and their `GenerationParams` in, token ids out, one error
type.

Everything that generates (the service, the evaluation, the benchmarks) talks to an `Engine`;
this module is the protocol only and imports no implementation.
`medtpe.inference.engines.vllm_engine.VllmEngine` is the real one
(`medtpe.inference.engines.factories` starts or connects it where the program is assembled);
`medtpe.inference.engines.instant.InstantEngine` answers at once, for tests and benchmarks of what
lies around the engine; the end-to-end tests use vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal, Protocol

from medtpe.core.declared import described

DistributedBackend = Literal["mp", "ray", "uni", "external_launcher"]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]


class EngineDead(RuntimeError):
    """The engine process died; the engine cannot serve any more requests."""


@dataclass(frozen=True)
class EngineOptions:
    """How the engine runs, whatever model it loads: the one declaration of each option's default
    and help (the service settings and the CLI read them with `medtpe.core.declared`)."""

    max_num_seqs: int = field(
        default=16, metadata=described("Sequences the engine's scheduler runs in one batch.")
    )
    kv_cache_gib: float | None = field(
        default=4.0,  # about 93,000 SmolLM2 tokens in float32 on CPU: 11 full 8,192-token prompts
        metadata=described("KV cache size in GiB (vLLM `kv_cache_memory_bytes`)."),
    )
    seed: int = field(default=0, metadata=described("Engine seed (sampling at temperature > 0)."))
    dtype: Dtype = field(
        default="auto",
        metadata=described(
            "Weights and activations (vLLM `dtype`); auto: float32 on a CPU without native "
            "bfloat16 (AVX-512 BF16 or AMX), where bfloat16 is emulated and about 8x slower "
            "(medtpe.inference.cpu_dtype), else vLLM's choice for the device (bfloat16 on a GPU "
            "or a bfloat16 CPU, which moves an answer's probability in steps of about 0.03 near "
            "p = 0.8: docs/benchmarks.md, Fidelity)."
        ),
    )
    enforce_eager: bool = field(
        default=False,
        metadata=described(
            "Skip torch.compile: the engine starts about a minute sooner on CPU, decodes about "
            "2x slower."
        ),
    )
    enable_prefix_caching: bool | None = field(
        default=None,
        metadata=described(
            "None: vLLM's default (on); off for measurements where every prompt must pay its "
            "prefill."
        ),
    )
    tensor_parallel_size: int = field(
        default=1,
        metadata=described(
            "GPUs one model is split across, layer by layer (vLLM `tensor_parallel_size`)."
        ),
    )
    pipeline_parallel_size: int = field(
        default=1,
        metadata=described("Pipeline stages (vLLM `pipeline_parallel_size`), e.g. one per node."),
    )
    distributed_executor_backend: DistributedBackend | None = field(
        default=None,
        metadata=described(
            "How vLLM launches its workers for parallel runs: `mp` (one node), `ray` (several "
            "nodes), `uni`, `external_launcher`; unset: vLLM chooses."
        ),
    )
    cpu_reserved_cores: int | None = field(
        default=None,
        metadata=described(
            "CPU engine: cores of the process's allowed set left to the API processes (the "
            "last ones); none: 0 on a machine of at most 4 cores (the engine computes on every "
            "core), vLLM's own reservation (one core) above (medtpe/inference/cpu_cores.py)."
        ),
    )
    log_stats: bool = field(
        default=True,
        metadata=described(
            "Keep vLLM's own statistics (prefix-cache hits, time to first token, ...): its "
            "`vllm:` Prometheus metrics in the process's default registry."
        ),
    )


@dataclass(frozen=True)
class EngineConfig:
    """What the engine loads and how much it may hold."""

    model_dir: Path
    max_model_len: int | None = None
    """Context length (prompt + answer); None: the model's own limit."""
    options: EngineOptions = field(default_factory=EngineOptions)


@dataclass(frozen=True)
class AnswerConstraint:
    """Structured output: the generated text must match exactly one of a regular expression, a
    choice of strings or a JSON schema (given as JSON text). The engine masks every token that
    would leave the allowed language, so the reported log-probabilities are those of the masked
    distribution."""

    regex: str | None = None
    choice: tuple[str, ...] | None = None
    json_schema: str | None = None

    def __post_init__(self) -> None:
        given = [v for v in (self.regex, self.choice, self.json_schema) if v is not None]
        if len(given) != 1:
            raise ValueError("an AnswerConstraint needs exactly one of regex, choice, json_schema")


@dataclass(frozen=True)
class GenerationParams:
    """How one prompt's answers are generated (the engine's `SamplingParams`): `n` answers at
    `temperature`, each at most `max_new_tokens` long."""

    n: int = 1
    temperature: float = 0.0
    max_new_tokens: int = 64
    seed: int | None = None
    """The sampling seed of this request (None: the engine's own)."""
    top_logprobs: int | None = None
    """k: each answer carries every position's top-k log-probabilities (None: none)."""
    cache_salt: str | None = None
    """Prompts with different salts never share cached prefixes (None: one shared space)."""
    constraint: AnswerConstraint | None = None
    """Answers that match it (structured output); None: free decoding."""
    stop_ids: frozenset[int] = frozenset()
    """The stop rule: each answer ends at the first of these ids it generates (kept in it)."""


class Finish(StrEnum):
    """Why a generation ended."""

    EOS = "eos"
    """The model's end-of-sequence token (not kept in the ids)."""
    STOP = "stop"
    """A stop id of the caller's stop rule (kept in the ids: its text is part of the answer)."""
    LENGTH = "length"
    """`max_new_tokens` reached."""


@dataclass(frozen=True)
class Completion:
    """One generated answer."""

    ids: list[int]
    """Its token ids: without the end-of-sequence token, with the stop id that ended it."""
    logprobs: list[dict[int, float]] | None = None
    """Per generated position, the top-k log-probabilities by token id, when asked for (the
    model's distribution before temperature, after a constraint's mask); None otherwise."""

    @property
    def first_logprobs(self) -> dict[int, float] | None:
        """The first generated token's top-k log-probabilities (None when not asked for or when
        nothing was generated)."""
        return self.logprobs[0] if self.logprobs else None

    finish: Finish = Finish.EOS
    cached_tokens: int = 0
    """Prompt tokens the engine did not compute, their KV reused from its prefix cache (vLLM
    `RequestOutput.num_cached_tokens`): whole cache blocks of the longest cached prefix, never
    the whole prompt (the last prompt token is always computed); the same for each of the
    prompt's `n` answers."""


class Engine(Protocol):
    """Generates answers to token-id prompts; raises `EngineDead` once it cannot serve."""

    max_model_len: int
    dtype: Dtype
    """The dtype it computes in, as resolved when it started: never `auto` (a receipt names
    it, and `medtpe verify` re-runs in it)."""

    @property
    def dead(self) -> bool:
        """True once the engine cannot serve any more requests."""
        ...

    async def generate(
        self, prompt_ids: Sequence[int], params: GenerationParams
    ) -> list[Completion]:
        """`params.n` answers to one prompt, generated as `params` says (its stop rule and
        constraint applied inside the engine)."""
        ...

    async def warm_up(self, prompt_ids: Sequence[int]) -> None:
        """One short generation, so the first real request does not pay the start-up costs."""
        ...

    async def prefill(self, prompt_ids: Sequence[int], cache_salt: str | None = None) -> None:
        """Compute `prompt_ids` into the prefix cache (under `cache_salt`), answering nothing:
        the part several prompts share, computed once before they are asked together."""
        ...

    def shutdown(self) -> None:
        """Stop the engine."""
        ...


EngineFactory = Callable[[EngineConfig], Engine]
"""Starts an engine for a config (blocking; callers run it off the event loop)."""
