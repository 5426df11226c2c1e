"""Embedding split: the frozen base matrix plus a trainable tensor holding only the new rows.

Only the M new rows are an `nn.Parameter`; the base matrix is a non-trainable buffer shared
with the model (no copy, no gradient, no optimizer state). The input side gathers each id from
one or the other; the output head computes the base logits with the frozen matrix and replaces
the new ids' columns by `hidden @ new_rows^T`, so autograd never forms a [vocab, hidden]
gradient. With tied embeddings both sides share one parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from medtpe.training.embedding_init import NewRows, has_tied_embeddings

if TYPE_CHECKING:
    from transformers import PreTrainedModel

EXTENSION_UNSUPPORTED = (
    "SSFT of an extension (without-replacement) MedTPE artefact is not supported: train the "
    "replacement artefact, then derive its twin with `medtpe extend-vocab` (rows carried over)"
)


class SplitEmbedding(nn.Module):
    """Input embedding lookup: new ids read `new_rows`, every other id the frozen `weight`."""

    def __init__(self, weight: torch.Tensor, new_ids: torch.Tensor, new_rows: nn.Parameter):
        super().__init__()
        self.register_buffer("weight", weight.detach(), persistent=False)
        self.register_buffer("new_ids", new_ids.to(weight.device), persistent=False)
        slot = torch.full((weight.shape[0],), -1, dtype=torch.long, device=weight.device)
        slot[self.new_ids] = torch.arange(len(new_ids), device=weight.device)
        self.register_buffer("slot", slot, persistent=False)
        self.new_rows = new_rows

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embeddings [..., hidden] for `input_ids` [...]."""
        base = F.embedding(input_ids, self.weight)
        slot = self.slot[input_ids]
        new = F.embedding(slot.clamp_min(0), self.new_rows).to(base.dtype)
        return torch.where((slot >= 0).unsqueeze(-1), new, base)


class SplitLMHead(nn.Module):
    """Output head: logits = hidden @ W_full^T, W_full's new-id rows taken from `new_rows`."""

    def __init__(self, weight: torch.Tensor, new_ids: torch.Tensor, new_rows: nn.Parameter):
        super().__init__()
        self.register_buffer("weight", weight.detach(), persistent=False)
        self.register_buffer("new_ids", new_ids.to(weight.device), persistent=False)
        self.new_rows = new_rows

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [..., vocab] for hidden states [..., hidden]."""
        logits = F.linear(hidden, self.weight)
        new = F.linear(hidden, self.new_rows.to(hidden.dtype))
        return logits.index_copy(-1, self.new_ids, new)


def apply_split(
    model: PreTrainedModel, new_ids: Sequence[int], rows: NewRows
) -> list[nn.Parameter]:
    """Freeze `model` and swap its embedding and output head for split modules holding `rows`.

    Returns the trainable parameters (the new rows: one tensor if tied, two if not). The rows
    are copied into float32 parameters on the model's device. Ids must be the model's own
    (replacement artefacts): `ValueError` for an extension artefact's fresh ids.
    """
    tied = has_tied_embeddings(model)
    if rows.output_base:
        raise ValueError("the rows' output side is the base head's: read it (`with_output_rows`)")
    if tied != (rows.output is None):
        raise ValueError("tied models take one set of rows, untied models two")
    embedding = model.get_input_embeddings()
    if max(new_ids, default=-1) >= embedding.weight.shape[0]:
        raise ValueError(f"new-token ids beyond the model's vocabulary; {EXTENSION_UNSUPPORTED}")
    model.requires_grad_(False)
    device = embedding.weight.device
    ids = torch.tensor(list(new_ids), dtype=torch.long, device=device)
    input_rows = nn.Parameter(rows.input.detach().float().to(device).clone())
    model.set_input_embeddings(SplitEmbedding(embedding.weight, ids, input_rows))
    head_weight = embedding.weight if tied else model.get_output_embeddings().weight
    if rows.output is None:
        output_rows = input_rows
    else:
        output_rows = nn.Parameter(rows.output.detach().float().to(device).clone())
    model.set_output_embeddings(SplitLMHead(head_weight, ids, output_rows))
    return [input_rows] if tied else [input_rows, output_rows]


def split_rows(model: PreTrainedModel) -> NewRows:
    """The current new rows (detached float32 CPU copies) of a model patched by `apply_split`."""
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    if not isinstance(embedding, SplitEmbedding) or not isinstance(head, SplitLMHead):
        raise TypeError("model is not patched by apply_split")
    rows = embedding.new_rows.detach().float().cpu().clone()
    if head.new_rows is embedding.new_rows:
        return NewRows(rows)
    return NewRows(rows, head.new_rows.detach().float().cpu().clone())
