"""The stretch's `rope_parameters` (`medtpe.core.rope_stretch`) give transformers' YaRN exactly the
frequencies of YaRN over the model's own context with the default betas: the longer original
length (for vLLM's cache) changes nothing a forward reads."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from medtpe.core.rope_stretch import STRETCHED_ROPE, stretched_rope  # noqa: E402


@pytest.mark.parametrize("stretch", [1.3, 1.88, 3.0])
def test_the_stretched_entry_reads_as_yarn_over_the_models_context(stretch: float) -> None:
    config = transformers.LlamaConfig(
        hidden_size=576, num_attention_heads=9, max_position_embeddings=8192, rope_theta=100000.0
    )
    ours = copy.deepcopy(config)
    ours.rope_parameters = stretched_rope(config.rope_parameters, 8192, stretch)
    plain_yarn = copy.deepcopy(config)
    plain_yarn.rope_parameters = {
        **config.rope_parameters,
        "rope_type": STRETCHED_ROPE,
        "factor": 1 / stretch,
        "original_max_position_embeddings": 8192,
    }
    init = ROPE_INIT_FUNCTIONS[STRETCHED_ROPE]
    (freqs, scale), (expected, expected_scale) = init(ours, "cpu"), init(plain_yarn, "cpu")
    assert torch.equal(freqs, expected) and scale == expected_scale == 1.0
    theta = config.rope_parameters["rope_theta"]
    base = 1.0 / theta ** (torch.arange(0, 64, 2, dtype=torch.float) / 64)  # plain RoPE
    assert torch.equal(freqs[:8], base[:8])  # the fastest dimensions as trained
    torch.testing.assert_close(freqs[-8:], base[-8:] * stretch)  # the slowest read × stretch
