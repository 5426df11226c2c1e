"""Initial embedding rows for MedTPE's new tokens.

`mean` (the paper, method step 4): a new token's row is the mean of its constituents' base rows,
rescaled to the norm α·μ, where μ is the mean row norm of the base matrix (α = 0.5). With tied
embeddings one set of rows serves input and output; untied models get an input set from the
input matrix and an output set from the output head, each rescaled with its own matrix's μ.

`last`: a new token's input row is its last constituent's base row, and the output side keeps
the base head's own rows of the reused ids (the export unties a tied head). A decoder reads a
pair's meaning at its last token's position, and a mean of two embeddings is no embedding the
model has seen (half their norm at α = 0.5): on held-out ICU prompts of 1,024 tokens the mean
rows lower p("yes") on 23 of 24 records, the last constituent's rows shift it by nothing
measurable; at 4,096 tokens they raise it (docs/benchmarks.md, Fidelity).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from medtpe.core.tokenizer.medtpe_tokenizer import NewToken

DEFAULT_ALPHA = 0.5
INIT_METHODS = ("mean", "last")
"""How new rows start (module docstring)."""


@dataclass
class NewRows:
    """Embedding rows of the new tokens, row i for `new_tokens[i]` (float32, [M, hidden]).

    `output` is None for tied models (the input rows serve the output head too).
    `rope_stretch`: the RoPE stretch the rows were trained to be read at
    (`medtpe.core.rope_stretch`; the export writes it into the model's config), None: plain RoPE.
    `output_base`: the output side is the base head's own rows of these (reused) ids, held by
    the base model rather than here (`output` is None; token distillation's `output: base`):
    the export unties a tied head and keeps them; `with_output_rows` reads them.
    """

    input: torch.Tensor
    output: torch.Tensor | None = None
    rope_stretch: float | None = None
    output_base: bool = False

    def __post_init__(self) -> None:
        if self.output_base and self.output is not None:
            raise ValueError("rows whose output side is the base head's hold no output rows")


def mean_row_norm(weight: torch.Tensor) -> torch.Tensor:
    """μ: the mean L2 norm of a matrix's rows (float32 scalar)."""
    return weight.detach().float().norm(dim=1).mean()


def init_rows(
    weight: torch.Tensor, constituents: Sequence[Sequence[int]], alpha: float = DEFAULT_ALPHA
) -> torch.Tensor:
    """Rows [M, hidden]: mean of each constituent set's rows of `weight`, rescaled to α·μ."""
    base = weight.detach().float()
    if not constituents:
        return base.new_zeros((0, base.shape[1]))
    rows = torch.stack([base[list(ids)].mean(dim=0) for ids in constituents])
    target = alpha * mean_row_norm(base)
    return rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12) * target


def has_tied_embeddings(model: PreTrainedModel) -> bool:
    """True when the output head shares the input embedding matrix."""
    output = model.get_output_embeddings()
    return output is None or output.weight is model.get_input_embeddings().weight


def with_output_rows(rows: NewRows, model: PreTrainedModel, ids: Sequence[int]) -> NewRows:
    """`rows` with an output side marked as the base head's (`NewRows.output_base`) read from
    `model`'s unmodified head at `ids` (float32 copies); other rows as they are."""
    if not rows.output_base:
        return rows
    head = model.get_output_embeddings().weight
    if max(ids, default=-1) >= head.shape[0]:
        raise ValueError("the base head has no rows for fresh ids (an extension artefact's)")
    return replace(rows, output=head.detach().float()[list(ids)].clone(), output_base=False)


def init_new_rows(
    model: PreTrainedModel,
    new_tokens: Sequence[NewToken],
    alpha: float = DEFAULT_ALPHA,
    method: str = "mean",
) -> NewRows:
    """Initial rows for `new_tokens` from `model`'s (unmodified) embedding matrices, by `method`
    (`INIT_METHODS`, module docstring). `mean` reads only the constituents (base ids), so an
    extension artefact's tokens (fresh ids) get the same rows as their replacement twins'."""
    if method not in INIT_METHODS:
        raise ValueError(f"init method: expected one of {INIT_METHODS}, not {method!r}")
    constituents = [token.constituents for token in new_tokens]
    if method == "last":
        last = [ids[-1] for ids in constituents]
        head = model.get_output_embeddings().weight.detach().float()
        if any(token.id >= head.shape[0] for token in new_tokens):
            raise ValueError(
                "init method 'last' keeps the base head rows of reused ids: "
                "an extension artefact's fresh ids have none"
            )
        return NewRows(
            model.get_input_embeddings().weight.detach().float()[last].clone(),
            head[[token.id for token in new_tokens]].clone(),
        )
    rows = init_rows(model.get_input_embeddings().weight, constituents, alpha)
    if has_tied_embeddings(model):
        return NewRows(rows)
    output = init_rows(model.get_output_embeddings().weight, constituents, alpha)
    return NewRows(rows, output)
