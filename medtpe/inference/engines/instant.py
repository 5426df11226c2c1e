"""The one fake engine, the seam for tests and benchmarks of what lies around the engine (the
HTTP layer, the batch job, the build's bookkeeping): it implements
`medtpe.inference.engines.protocol.Engine`, reads the served checkpoint's own tokenizer, and answers
every prompt with that tokenizer's ids of a fixed answer. `delay_s` holds each generation (deadline
and queue tests) until `release()`; `die()` makes it report death like a crashed vLLM. Like vLLM's
automatic prefix cache it remembers prompts in blocks, per cache salt, and reports each answer's
`cached_tokens` as vLLM would (`PrefixCache`). It imports no vLLM; never used by the product
itself."""

from __future__ import annotations

import asyncio
import hashlib
import math
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from medtpe.core.tokenizer import BaseTokenizer
from medtpe.inference.engines.protocol import (
    AnswerConstraint,
    Completion,
    Dtype,
    EngineConfig,
    EngineDead,
    EngineFactory,
    Finish,
    GenerationParams,
)

ANSWER = 'yes"}'
"""What follows the `{"answer": "` prefill: a well-formed binary answer."""

PREFIX_BLOCK_TOKENS = 128
"""Tokens per cache block: vLLM's KV-cache block size on CPU (`vllm.platforms.cpu` sets 128
unless the block size is given)."""
PREFIX_CACHE_BLOCKS = 4096
"""The most blocks `PrefixCache` remembers (524,288 tokens); the least recently used go first."""


class PrefixCache:
    """Which prompt prefixes an engine would hold in its prefix cache, as vLLM's automatic prefix
    caching finds them: full blocks of `block_tokens` ids, each keyed by a hash chained from the
    cache salt through every block before it (prompts with different salts never share a block),
    at most `max_blocks` of them, the least recently used forgotten first (a prompt's tail blocks
    before its head, as vLLM frees them)."""

    def __init__(
        self, block_tokens: int = PREFIX_BLOCK_TOKENS, max_blocks: int = PREFIX_CACHE_BLOCKS
    ) -> None:
        self.block_tokens = block_tokens
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        """The blocks remembered."""
        return len(self._blocks)

    def _keys(self, prompt_ids: Sequence[int], salt: str | None) -> list[bytes]:
        """The chained key of each full block of the prompt (an empty salt is no salt, as in
        vLLM)."""
        key = hashlib.sha256((salt or "").encode()).digest()
        keys = []
        for start in range(0, len(prompt_ids) - self.block_tokens + 1, self.block_tokens):
            block = array("q", prompt_ids[start : start + self.block_tokens]).tobytes()
            key = hashlib.sha256(key + block).digest()
            keys.append(key)
        return keys

    def admit(self, prompt_ids: Sequence[int], salt: str | None) -> int:
        """The prompt's tokens found cached: the full blocks of its longest cached prefix, within
        all but its last token (which the engine always computes, for the next token's
        logits); then its full blocks are remembered as the most recently used."""
        keys = self._keys(prompt_ids, salt)
        reusable = (len(prompt_ids) - 1) // self.block_tokens
        hits = 0
        while hits < reusable and keys[hits] in self._blocks:
            hits += 1
        for key in reversed(keys):  # the head most recent: the tail is forgotten first
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)
        return hits * self.block_tokens


class InstantEngine:
    """Answers `ANSWER` at once (after `delay_s`), with first-token logprobs on request."""

    def __init__(
        self, model_dir: Path, max_model_len: int, delay_s: float = 0.0, dtype: Dtype = "auto"
    ) -> None:
        tokenizer = BaseTokenizer.load(model_dir)  # parsed once per content in a process
        self.answer_ids = tokenizer.encode(ANSWER, special_tokens=True)
        self.option_ids = {
            option: tokenizer.encode(option, special_tokens=True)[0] for option in ("yes", "no")
        }
        self.max_model_len = max_model_len
        self.dtype: Dtype = "float32" if dtype == "auto" else dtype
        """The configured dtype; `auto` is float32 here (it computes nothing), as on a CPU
        without native bfloat16."""
        self.delay_s = delay_s
        self.prompts: list[list[int]] = []
        self.cache_salts: list[str | None] = []
        """The cache salt of each generation, in order."""
        self.constraints: list[AnswerConstraint | None] = []
        """The answer constraint of each generation, in order."""
        self.prefix_cache = PrefixCache()
        self.prefills: list[list[int]] = []
        """The ids of each `prefill`, in order (not answers: not in `prompts`)."""
        self._dead = False
        self._released = threading.Event()

    @classmethod
    def factory(cls, delay_s: float = 0.0) -> EngineFactory:
        """An `EngineFactory` making instant engines with this delay."""

        def start(config: EngineConfig) -> InstantEngine:
            max_model_len = config.max_model_len or 8192
            return cls(config.model_dir, max_model_len, delay_s, config.options.dtype)

        return start

    @property
    def dead(self) -> bool:
        """Whether `die()` was called."""
        return self._dead

    def die(self) -> None:
        """From now on, report death and refuse to generate."""
        self._dead = True

    def release(self) -> None:
        """End the held generations now and hold no more (any thread): a test holds a request
        for as long as it needs, not for a guessed time."""
        self._released.set()

    async def _hold(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self._released.is_set() and (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.02))

    async def generate(
        self, prompt_ids: Sequence[int], params: GenerationParams
    ) -> list[Completion]:
        """`params.n` copies of the fixed answer, cut after its first stop id or at
        `max_new_tokens` (it matches every binary task's constraint after the prefill; the
        constraint is recorded, not applied), each with the prompt's prefix-cache hit."""
        if self._dead:
            raise EngineDead("the engine is dead")
        self.prompts.append(list(prompt_ids))
        self.cache_salts.append(params.cache_salt)
        self.constraints.append(params.constraint)
        cached_tokens = self.prefix_cache.admit(prompt_ids, params.cache_salt)
        if self.delay_s:
            await self._hold(self.delay_s)
        if self._dead:
            raise EngineDead("the engine died during generation")
        ids, finish = list(self.answer_ids), Finish.EOS
        stop_at = next((k for k, token in enumerate(ids) if token in params.stop_ids), None)
        if stop_at is not None:
            ids, finish = ids[: stop_at + 1], Finish.STOP
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], Finish.LENGTH
        logprobs = None
        if params.top_logprobs:
            yes, no = self.option_ids["yes"], self.option_ids["no"]
            logprobs = [{yes: math.log(0.75), no: math.log(0.25)}]
            logprobs += [{token: 0.0} for token in ids[1:]]
        return [Completion(ids, logprobs, finish, cached_tokens) for _ in range(params.n)]

    async def warm_up(self, prompt_ids: Sequence[int]) -> None:
        """One generation like any other, recorded, but never held by `delay_s`: an engine
        that holds its requests is ready at once."""
        delay, self.delay_s = self.delay_s, 0.0
        try:
            await self.generate(prompt_ids, GenerationParams(max_new_tokens=2))
        finally:
            self.delay_s = delay

    async def prefill(self, prompt_ids: Sequence[int], cache_salt: str | None = None) -> None:
        """Remember the prompt's full blocks in the prefix cache, at once, recorded in
        `prefills`."""
        if self._dead:
            raise EngineDead("the engine is dead")
        self.prefills.append(list(prompt_ids))
        self.prefix_cache.admit(prompt_ids, cache_salt)

    def shutdown(self) -> None:
        """Nothing to stop."""
