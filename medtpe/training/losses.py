"""SSFT losses: cross-entropy to the pseudo-labels (`ce`), distillation to the original model's
next-token distributions at the answer positions (`kl`), or `kl_dense`: `kl` plus the mean KL at
a sample of the prompt's shared ends (`DensePositions`: points of the text where a MedTPE token
and an original token both end, so both models predict what follows the same text). `kl` sees a
few answer positions per window; `kl_dense` adds hundreds spread over the whole window, the
student's whole reading of the compressed record held to the original's.

Logits are computed only at the positions a loss reads (a 8k-token prompt would otherwise cost
a [8k, vocab] logits tensor per sequence).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from medtpe.training.embedding_split import SplitEmbedding, SplitLMHead

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from medtpe.core.tokenizer import MedTPETokenizer
    from medtpe.training.examples import Example

DENSE_POSITIONS = 256
"""Shared ends per window that `kl_dense` reads (evenly spaced over the prompt)."""


class DensePositions:
    """Where `kl_dense` reads a batch: up to `n` shared ends per window, evenly spaced over its
    prompt (the last prompt position, an answer position, excluded), as flat indices into the
    student's and the teacher's [batch, width] hidden states."""

    def __init__(self, tokenizer: MedTPETokenizer, n: int = DENSE_POSITIONS) -> None:
        self.tokenizer = tokenizer
        self.n = n

    def __call__(
        self, batch: Sequence[Example], student_width: int, teacher_width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(student indices, teacher indices), aligned pairwise."""
        student, teacher = [], []
        for row, example in enumerate(batch):
            i, j = self.tokenizer.shared_ends(example.student, example.teacher)
            interior = i < len(example.student) - 1
            i, j = i[interior], j[interior]
            pick = np.unique(np.linspace(0, len(i) - 1, min(self.n, len(i))).round().astype(int))
            student.append(row * student_width + i[pick])
            teacher.append(row * teacher_width + j[pick])
        return (
            torch.from_numpy(np.concatenate(student)).long(),
            torch.from_numpy(np.concatenate(teacher)).long(),
        )


def final_hidden(
    model: PreTrainedModel,
    attention_mask: torch.Tensor,
    input_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
) -> torch.Tensor:
    """Final hidden states [batch, width, hidden]."""
    out = model.base_model(
        input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask
    )
    return out.last_hidden_state


def student_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """Logits [N, vocab] of the split (MedTPE) model for hidden states [N, hidden]."""
    return model.get_output_embeddings()(hidden).float()


@torch.no_grad()
def teacher_hidden(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Final hidden states [batch, width, hidden] of the ORIGINAL model (the split model's frozen
    matrices, new rows ignored) on original-tokenizer ids."""
    embedding: SplitEmbedding = model.get_input_embeddings()
    embeds = F.embedding(input_ids, embedding.weight)
    return final_hidden(model, attention_mask, inputs_embeds=embeds)


@torch.no_grad()
def teacher_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """Logits [N, vocab] of the ORIGINAL model's head (new rows ignored) for hidden [N, hidden]."""
    head: SplitLMHead = model.get_output_embeddings()
    return F.linear(hidden, head.weight).float()


def cross_entropy(logits: torch.Tensor, answer_ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of answer logits [N, vocab] against the answer ids [N]."""
    return F.cross_entropy(logits, answer_ids)


def distillation_kl(
    student: torch.Tensor, teacher: torch.Tensor, keep: torch.Tensor
) -> torch.Tensor:
    """Mean KL(teacher ‖ student) per position over the kept vocabulary columns (`keep`:
    bool [vocab]; the reused ids are dropped, as they mean different tokens on each side)."""
    log_student = F.log_softmax(student[:, keep], dim=-1)
    log_teacher = F.log_softmax(teacher[:, keep], dim=-1)
    return F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean")
