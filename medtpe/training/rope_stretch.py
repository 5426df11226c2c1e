"""RoPE's slow dimensions stretched on a loaded Hugging Face model (`medtpe.core.rope_stretch`):
the rotary embedding's frequencies swapped in place, so one model reads plain and stretched."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from medtpe.core.rope_stretch import STRETCHED_ROPE, stretched_rope

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def stretch_rope(model: PreTrainedModel, stretch: float | None) -> None:
    """Read `model`'s positions with RoPE's slow dimensions stretched by `stretch` (None: plain
    RoPE again, as loaded)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rotary = model.model.rotary_emb
    if stretch is None:
        rotary.inv_freq.copy_(rotary.original_inv_freq)
        rotary.attention_scaling = 1.0
        return
    config = copy.deepcopy(model.config)
    config.rope_parameters = stretched_rope(
        config.rope_parameters, config.max_position_embeddings, stretch
    )
    init = ROPE_INIT_FUNCTIONS[STRETCHED_ROPE]
    inv_freq, rotary.attention_scaling = init(config, rotary.inv_freq.device)
    rotary.inv_freq.copy_(inv_freq)
