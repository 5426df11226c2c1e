"""Answer scoring with a Hugging Face forward, in float32: what the model puts on the answer's
first token, where the served engine (bfloat16) rounds it.

`RowsModel` is the base model with one set of MedTPE rows written into its embedding matrix
(the input side always; the output side too when tied — as the export serves it — or kept at
the base rows, `output="base"`). `score` reads one prompt's last position: the top-k
log-probabilities (for `medtpe.inference.predictor.Predictor.option_probabilities`, the service's
own rule), the probability mass on MedTPE's reused ids, and the hidden state of every layer. One
forward per prompt, no KV cache: O(n²) attention, ~1 s per 1k tokens on this CPU.

>>> model = RowsModel(base_dir)  # doctest: +SKIP
>>> model.set_rows(new_ids, rows)  # doctest: +SKIP
>>> model.score(medtpe_ids).top_logprobs  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from medtpe.training.embedding_init import NewRows
from medtpe.training.rope_stretch import stretch_rope

OutputSide = Literal["tied", "base"]
"""How the new ids' output (LM head) rows are served: the trained input rows (`tied`, as a
tied checkpoint serves them), or the base model's own rows for those ids (`base`)."""
TOP_K = 20


@dataclass(frozen=True)
class PromptScore:
    """One prompt's last position under one model."""

    top_logprobs: dict[int, float]
    """The `TOP_K` most likely next ids and their log-probabilities (full vocabulary)."""
    new_id_mass: float
    """Probability mass on the MedTPE ids (0 when no rows are set)."""
    hidden: np.ndarray
    """[layers + 1, hidden] float32: the embedding output and each layer's output (the last
    after the final norm, as the LM head reads it)."""


class RowsModel:
    """The base model with swappable MedTPE rows (one copy of the weights), in float32 (the
    rows' own error) or another `dtype` (bfloat16: a served dtype's rounding), on `device`."""

    def __init__(
        self,
        base_dir: Path,
        threads: int | None = None,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        from transformers import AutoModelForCausalLM

        if threads:
            torch.set_num_threads(threads)
        self.device = torch.device(device)
        self.model = (
            AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype).to(self.device).eval()
        )
        embedding = self.model.get_input_embeddings()
        self._base_input = embedding.weight.detach().clone()
        head = self.model.get_output_embeddings()
        self._tied = head.weight is embedding.weight
        self._base_output = head.weight.detach().clone()
        if self._tied:  # untie, so the two sides can differ; tied rows are written to both
            head.weight = nn.Parameter(self._base_output.clone(), requires_grad=False)
        self.new_ids: list[int] = []

    @property
    def base_input(self) -> torch.Tensor:
        """The base model's input embedding matrix (the model's dtype, never modified)."""
        return self._base_input

    def set_rows(
        self, new_ids: Sequence[int], rows: NewRows | None, output: OutputSide = "tied"
    ) -> None:
        """Serve `rows` at `new_ids` (None: the base model). `output="tied"` serves them as the
        export does: the input rows in the LM head too (a tied model's), or an untied model's
        output rows, or the base head rows where those are the output side
        (`NewRows.output_base`); `"base"` keeps the base head rows there."""
        embedding = self.model.get_input_embeddings().weight
        head = self.model.get_output_embeddings().weight
        with torch.no_grad():
            embedding.copy_(self._base_input)
            head.copy_(self._base_output)
            self.new_ids = list(new_ids) if rows is not None else []
            if rows is None:
                return
            ids = torch.tensor(self.new_ids, dtype=torch.long, device=self.device)
            embedding[ids] = rows.input.to(embedding)
            if output == "tied" and not rows.output_base:
                head[ids] = (rows.input if rows.output is None else rows.output).to(head)

    def set_rope_stretch(self, stretch: float | None) -> None:
        """Read positions with RoPE's slow dimensions stretched by `stretch` (what a
        `rope_parameters` entry of an export's config.json gives every prompt:
        `medtpe.core.rope_stretch`); None: plain RoPE."""
        stretch_rope(self.model, stretch)

    @torch.inference_mode()
    def next_token_logprobs(self, ids: Sequence[int]) -> torch.Tensor:
        """Log-probabilities [len(ids), vocab] of the next id after each prefix of `ids`."""
        out = self.model(input_ids=self._ids(ids))
        return torch.log_softmax(out.logits[0].float(), dim=-1).cpu()

    def _ids(self, ids: Sequence[int]) -> torch.Tensor:
        """`ids` as a [1, n] tensor on the model's device."""
        return torch.tensor([list(ids)], dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def score(
        self,
        ids: Sequence[int],
        positions: Sequence[int] | Sequence[float] | None = None,
        visible: np.ndarray | None = None,
    ) -> PromptScore:
        """The last position of `ids` (see `PromptScore`), read at `positions` (RoPE position
        ids, gaps and fractions allowed; None: 0, 1, 2, ...); `visible`: an (n, n) attention
        mask (query, key) in place of the causal one, boolean or additive float."""
        position_ids = None
        if positions is not None:  # float positions (a scaled reading) are RoPE's too
            position_ids = torch.tensor([list(positions)], device=self.device)
        tokens = self._ids(ids)
        mask = torch.ones_like(tokens)  # one causal sequence whatever the gaps
        if visible is not None:
            mask = torch.from_numpy(visible)[None, None].to(self.device)
        out = self.model.model(
            input_ids=tokens,
            position_ids=position_ids,
            attention_mask=mask,
            output_hidden_states=True,
        )
        last = out.last_hidden_state[0, -1]
        logprobs = torch.log_softmax(self.model.lm_head(last).float(), dim=-1)
        top = torch.topk(logprobs, TOP_K)
        mass = float(logprobs[self.new_ids].exp().sum()) if self.new_ids else 0.0
        hidden = [h[0, -1] for h in out.hidden_states[:-1]] + [last]
        return PromptScore(
            {int(i): float(v) for i, v in zip(top.indices, top.values, strict=True)},
            mass,
            torch.stack(hidden).float().cpu().numpy(),
        )
