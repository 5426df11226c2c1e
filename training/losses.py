"""SSFT losses on the answer tokens: cross-entropy to the pseudo-labels, or distillation (KL to
the original model's next-token distributions at the same answer positions).

Logits are computed only at the answer positions (a 1k-token prompt would otherwise cost a
[1k, vocab] logits tensor per sequence).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from training.embedding_split import SplitEmbedding, SplitLMHead
from training.examples import IGNORE_INDEX

if TYPE_CHECKING:
    from transformers import PreTrainedModel

LOSSES = ("ce", "kl")


def answer_hidden(
    model: PreTrainedModel,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    input_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
) -> torch.Tensor:
    """Final hidden states [N, hidden] at the N positions whose label is set (row-major order)."""
    out = model.base_model(
        input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask
    )
    return out.last_hidden_state[labels != IGNORE_INDEX]


def student_logits(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
) -> torch.Tensor:
    """Logits [N, vocab] of the split (MedTPE) model at the answer positions."""
    hidden = answer_hidden(model, attention_mask, labels, input_ids=input_ids)
    return model.get_output_embeddings()(hidden).float()


@torch.no_grad()
def teacher_logits(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
) -> torch.Tensor:
    """Logits [N, vocab] of the ORIGINAL model (the split model's frozen matrices, new rows
    ignored) on original-tokenizer ids, at the answer positions."""
    embedding: SplitEmbedding = model.get_input_embeddings()
    head: SplitLMHead = model.get_output_embeddings()
    embeds = F.embedding(input_ids, embedding.weight)
    hidden = answer_hidden(model, attention_mask, labels, inputs_embeds=embeds)
    return F.linear(hidden, head.weight).float()


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of answer logits [N, vocab] against the answer labels."""
    return F.cross_entropy(logits, labels[labels != IGNORE_INDEX])


def distillation_kl(
    student: torch.Tensor, teacher: torch.Tensor, keep: torch.Tensor
) -> torch.Tensor:
    """Mean KL(teacher ‖ student) per answer position over the kept vocabulary columns (`keep`:
    bool [vocab]; the reused ids are dropped, as they mean different tokens on each side)."""
    log_student = F.log_softmax(student[:, keep], dim=-1)
    log_teacher = F.log_softmax(teacher[:, keep], dim=-1)
    return F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean")
