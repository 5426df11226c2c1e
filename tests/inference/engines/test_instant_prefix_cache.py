"""The instant engine's model of vLLM's automatic prefix cache (`PrefixCache`): a prompt that
repeats an earlier one's prefix under the same cache salt reports that prefix's full blocks as
`cached_tokens` (never the whole prompt), another salt shares nothing, and the cache holds at
most its bound of blocks, a prompt's tail forgotten before its head. The real engine's figure
for the same prompts: tests/inference/engines/test_vllm_engine.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from medtpe.core.paths import default_model_dir
from medtpe.inference.engines.instant import PREFIX_BLOCK_TOKENS, InstantEngine, PrefixCache
from medtpe.inference.engines.protocol import Completion, GenerationParams
from medtpe.training.default_model import ensure_base_model

BLOCK = PREFIX_BLOCK_TOKENS
PREFIX = list(range(1000, 1000 + 2 * BLOCK + 44))
"""A record-like shared start: two full blocks and part of a third."""


@pytest.fixture(scope="module")
def engine() -> InstantEngine:
    """An instant engine on the default model's tokenizer."""
    return InstantEngine(ensure_base_model(default_model_dir()), 8192)


def generate(engine: InstantEngine, prompt: Sequence[int], params: GenerationParams) -> list[int]:
    """Each answer's `cached_tokens` for one prompt."""
    completions: list[Completion] = asyncio.run(engine.generate(prompt, params))
    return [c.cached_tokens for c in completions]


def test_a_shared_prefix_is_reported_cached(engine: InstantEngine) -> None:
    params = GenerationParams(n=2, cache_salt="tenant-a")
    assert generate(engine, PREFIX + [7] * 50, params) == [0, 0]
    # the prefix's full blocks, the same for each of the n answers
    assert generate(engine, PREFIX + [8] * 50, params) == [2 * BLOCK, 2 * BLOCK]
    # a prompt seen whole is still not served whole: its last token is always computed
    assert generate(engine, PREFIX[: 2 * BLOCK], params) == [BLOCK, BLOCK]


def test_other_salts_share_nothing(engine: InstantEngine) -> None:
    prompt = [5] * 3 * BLOCK + [6]
    assert generate(engine, prompt, GenerationParams(cache_salt="tenant-b")) == [0]
    assert generate(engine, prompt, GenerationParams(cache_salt="tenant-c")) == [0]
    assert generate(engine, prompt, GenerationParams()) == [0]
    assert generate(engine, prompt, GenerationParams(cache_salt="tenant-b")) == [3 * BLOCK]


def test_the_cache_holds_its_bound_tail_blocks_first() -> None:
    cache = PrefixCache(block_tokens=4, max_blocks=6)
    p, q, r = ([k] * 12 for k in (1, 2, 3))  # three full blocks each
    assert cache.admit(p, None) == cache.admit(q, None) == 0
    assert len(cache) == 6
    cache.admit(r[:8], None)  # two more blocks: p's two tail blocks go, its head stays
    assert len(cache) == 6
    assert cache.admit([*p, 0], None) == 4
    for k in range(10, 40):
        cache.admit([k] * 20, None)
        assert len(cache) <= 6
    assert cache.admit([39] * 20, None) == 16  # the newest prompt is still held
