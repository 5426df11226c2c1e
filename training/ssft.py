"""Self-supervised fine-tuning (SSFT) of the new embedding rows (paper, method step 5).

Everything is frozen except the new rows (an embedding split, `training.embedding_split`).
The loss is cross-entropy on the original model's greedy answers (`ce`), or distillation to
its next-token distributions over the answer (`kl`). AdamW (lr 5e-5), batch 2 × accumulation 2,
linear warm-up over 10 % of the steps then cosine decay, validation (pseudo-label
cross-entropy on held-out examples) every K optimizer steps with early stopping, seed 1.
A checkpoint after every validation makes an interrupted run resumable from its run directory.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from training.embedding_init import NewRows, init_new_rows
from training.embedding_split import apply_split, split_rows
from training.examples import Example, collate
from training.losses import LOSSES, cross_entropy, distillation_kl, student_logits, teacher_logits

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from medtpe_core.tokenizer import MedTPETokenizer

CHECKPOINT_FILE = "checkpoint.pt"
HISTORY_FILE = "history.csv"


@dataclass
class SSFTConfig:
    """Training settings (defaults: the paper's, except K and the epoch count)."""

    loss: str = "ce"
    lr: float = 5e-5
    batch_size: int = 2
    grad_accum: int = 2
    warmup_ratio: float = 0.1
    epochs: int = 1
    eval_every: int = 25
    patience: int = 3
    seed: int = 1
    max_steps: int | None = None
    gradient_checkpointing: bool = False
    device: str | None = None

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, not {self.loss!r}")


@dataclass
class SSFTResult:
    """Best rows (by validation loss) and the run's record."""

    rows: NewRows
    initial_val_loss: float
    best_val_loss: float
    steps: int
    stopped_early: bool
    history: list[dict[str, Any]] = field(default_factory=list)


def pick_device(name: str | None = None) -> torch.device:
    """The requested device, else CUDA when present, else the CPU."""
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def load_split_model(
    base_dir: Path, tokenizer: MedTPETokenizer, device: torch.device
) -> tuple[PreTrainedModel, list[torch.nn.Parameter]]:
    """The base model with embedding-split modules holding freshly initialised new rows."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).to(device)
    rows = init_new_rows(model, tokenizer.new_tokens)
    params = apply_split(model, [t.id for t in tokenizer.new_tokens], rows)
    return model, params


def _batches(examples: Sequence[Example], size: int) -> list[list[Example]]:
    return [list(examples[i : i + size]) for i in range(0, len(examples), size)]


def _autocast(device: torch.device) -> torch.autocast:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def batch_loss(
    model: PreTrainedModel,
    batch: Sequence[Example],
    loss: str,
    keep: torch.Tensor,
    device: torch.device,
) -> tuple[torch.Tensor, int]:
    """The batch's mean loss over its answer tokens, and that token count."""
    ids, mask, labels = (t.to(device) for t in collate(batch, "student"))
    with _autocast(device):
        logits = student_logits(model, ids, mask, labels)
        if loss == "ce":
            return cross_entropy(logits, labels), logits.shape[0]
        t_ids, t_mask, t_labels = (t.to(device) for t in collate(batch, "teacher"))
        teacher = teacher_logits(model, t_ids, t_mask, t_labels)
    return distillation_kl(logits, teacher, keep), logits.shape[0]


@torch.no_grad()
def validation_loss(
    model: PreTrainedModel, examples: Sequence[Example], batch_size: int, device: torch.device
) -> float:
    """Token-weighted mean cross-entropy of the pseudo-labels on `examples`."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in _batches(examples, batch_size):
        loss, n = batch_loss(model, batch, "ce", torch.empty(0), device)
        total, count = total + loss.item() * n, count + n
    model.train(was_training)
    return total / max(count, 1)


def _schedule(total_steps: int, warmup_ratio: float) -> Callable[[int], float]:
    """LambdaLR factor: linear warm-up over `warmup_ratio` of the steps, then cosine to 0."""
    warmup = max(1, round(total_steps * warmup_ratio))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def _save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _write_history(path: Path, history: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["step", "train_loss", "val_loss", "lr"])
        writer.writeheader()
        writer.writerows(history)


def train_ssft(
    base_dir: Path,
    tokenizer: MedTPETokenizer,
    train: Sequence[Example],
    val: Sequence[Example],
    run_dir: Path,
    config: SSFTConfig,
    resume: bool = True,
) -> SSFTResult:
    """Train the new rows; returns the rows with the best validation loss.

    `run_dir` receives `checkpoint.pt` (after every validation) and `history.csv`; with
    `resume`, an existing checkpoint there is continued from its last validation.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    device = pick_device(config.device)
    torch.manual_seed(config.seed)
    model, params = load_split_model(base_dir, tokenizer, device)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    keep = torch.ones(model.config.vocab_size, dtype=torch.bool, device=device)
    keep[[t.id for t in tokenizer.new_tokens]] = False

    micro_per_epoch = math.ceil(len(train) / config.batch_size)
    steps_per_epoch = math.ceil(micro_per_epoch / config.grad_accum)
    total_steps = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _schedule(total_steps, config.warmup_ratio)
    )

    checkpoint_path = run_dir / CHECKPOINT_FILE
    state: dict[str, Any] = {"step": 0, "history": [], "bad_checks": 0, "stopped": False}
    if resume and checkpoint_path.is_file():
        state = torch.load(checkpoint_path, map_location=device, weights_only=False)
        if state["config"] != asdict(config):
            raise ValueError(f"{checkpoint_path} was written with other settings")
        with torch.no_grad():
            for param, saved in zip(params, state["params"], strict=True):
                param.copy_(saved)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
    else:
        state["initial_val_loss"] = validation_loss(model, val, config.batch_size, device)
        state["best_val_loss"] = state["initial_val_loss"]
        state["best_rows"] = split_rows(model)
        state["history"].append(
            {"step": 0, "train_loss": "", "val_loss": state["initial_val_loss"], "lr": 0.0}
        )

    def checkpoint() -> None:
        state.update(
            config=asdict(config),
            params=[p.detach().clone() for p in params],
            optimizer=optimizer.state_dict(),
            scheduler=scheduler.state_dict(),
            rng=torch.get_rng_state(),
        )
        _save_checkpoint(checkpoint_path, state)
        _write_history(run_dir / HISTORY_FILE, state["history"])

    model.train()
    bar = tqdm(total=total_steps, initial=state["step"], desc=f"ssft[{config.loss}]", unit="step")
    bar.set_postfix(val=f"{state['best_val_loss']:.4f}")
    while state["step"] < total_steps and not state["stopped"]:
        epoch, within = divmod(state["step"], steps_per_epoch)
        order = torch.randperm(
            len(train), generator=torch.Generator().manual_seed(config.seed + epoch)
        )
        micro = _batches([train[i] for i in order.tolist()], config.batch_size)
        start = within * config.grad_accum
        for step_batches in _batches(micro[start:], config.grad_accum):
            step_loss = 0.0
            for batch in step_batches:
                loss, _ = batch_loss(model, batch, config.loss, keep, device)
                (loss / len(step_batches)).backward()
                step_loss += loss.item() / len(step_batches)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            row = {
                "step": state["step"],
                "train_loss": step_loss,
                "val_loss": "",
                "lr": scheduler.get_last_lr()[0],
            }
            state["history"].append(row)
            bar.update(1)
            bar.set_postfix(loss=f"{step_loss:.4f}", val=f"{state['best_val_loss']:.4f}")
            last = state["step"] >= total_steps
            if state["step"] % config.eval_every == 0 or last:
                row["val_loss"] = validation_loss(model, val, config.batch_size, device)
                if row["val_loss"] < state["best_val_loss"]:
                    state.update(
                        best_val_loss=row["val_loss"], best_rows=split_rows(model), bad_checks=0
                    )
                else:
                    state["bad_checks"] += 1
                    state["stopped"] = state["bad_checks"] >= config.patience
                checkpoint()
            if last or state["stopped"]:
                break
    bar.close()
    return SSFTResult(
        rows=state["best_rows"],
        initial_val_loss=state["initial_val_loss"],
        best_val_loss=state["best_val_loss"],
        steps=state["step"],
        stopped_early=state["stopped"],
        history=state["history"],
    )
