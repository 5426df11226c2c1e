"""Self-supervised fine-tuning (SSFT) of the new embedding rows (paper, method step 5).

Everything is frozen except the new rows (an embedding split, `medtpe.training.embedding_split`).
The loss is cross-entropy on the original model's greedy answers (`ce`), distillation to its
next-token distributions over the answer (`kl`), or that plus distillation at shared ends over
the whole prompt (`kl_dense`; `medtpe.training.losses`). AdamW (lr 5e-5), batch 2 × accumulation 2,
linear warm-up over 10 % of the steps then cosine decay, validation every K optimizer steps
with early stopping, seed 1. Validation measures every loss on held-out examples and keeps the
rows best by the run's own loss (a `kl` run's CE to the greedy answers may rise while it moves
toward the original model's probabilities).
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

from medtpe.training.embedding_init import (
    NewRows,
    has_tied_embeddings,
    init_new_rows,
    with_output_rows,
)
from medtpe.training.embedding_split import apply_split, split_rows
from medtpe.training.examples import IGNORE_INDEX, Example, collate
from medtpe.training.export import load_rows_file
from medtpe.training.loss_names import LOSSES
from medtpe.training.losses import (
    DENSE_POSITIONS,
    DensePositions,
    cross_entropy,
    distillation_kl,
    final_hidden,
    student_logits,
    teacher_hidden,
    teacher_logits,
)

VAL_COLUMNS = tuple(f"val_{name}" for name in LOSSES)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from medtpe.core.tokenizer import MedTPETokenizer

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
    dense_positions: int = DENSE_POSITIONS
    """Shared ends per window that `kl_dense` reads (validation measures it for every run)."""
    device: str | None = None
    init_rows: Path | None = None
    """Rows to start from (a rows file of `medtpe.training.export.save_rows` for the same tokens,
    e.g. an earlier stage of a curriculum); None: the constituents' mean (paper, step 4)."""

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, not {self.loss!r}")


@dataclass
class SSFTResult:
    """Best rows (by the run's own validation loss) and the run's record; `best_val` holds
    every held-out loss (`ce`, `kl`, `kl_dense`) of those rows."""

    rows: NewRows
    initial_val_loss: float
    best_val_loss: float
    best_val: dict[str, float]
    steps: int
    stopped_early: bool
    history: list[dict[str, Any]] = field(default_factory=list)


def pick_device(name: str | None = None) -> torch.device:
    """The requested device, else CUDA when present, else the CPU."""
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def weights_dtype(device: torch.device) -> torch.dtype:
    """The frozen weights' dtype: bfloat16 on a CUDA device that supports it (half the memory,
    tensor-core matmuls), float32 elsewhere. The trained rows stay float32 (`apply_split`)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def load_split_model(
    base_dir: Path,
    tokenizer: MedTPETokenizer,
    device: torch.device,
    initial: NewRows | None = None,
    init: str = "mean",
) -> tuple[PreTrainedModel, list[torch.nn.Parameter]]:
    """The base model (in `weights_dtype`) with embedding-split modules holding float32 new
    rows: `initial` (an output side that is the base head's read from the float32 weights),
    else freshly initialised from them by `init` (`medtpe.training.embedding_init.INIT_METHODS`)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    new_ids = [t.id for t in tokenizer.new_tokens]
    rows = init_new_rows(model, tokenizer.new_tokens, method=init)
    if has_tied_embeddings(model):  # one tied set of rows is trained (`last` keeps a head side)
        rows = NewRows(rows.input)
    if initial is not None:
        if initial.input.shape != rows.input.shape:
            raise ValueError(
                f"initial rows of shape {tuple(initial.input.shape)}, this artefact's new "
                f"tokens need {tuple(rows.input.shape)}"
            )
        rows = with_output_rows(initial, model, new_ids)
    model = model.to(device=device, dtype=weights_dtype(device))
    params = apply_split(model, new_ids, rows)
    return model, params


def _batches(examples: Sequence[Example], size: int) -> list[list[Example]]:
    return [list(examples[i : i + size]) for i in range(0, len(examples), size)]


def _autocast(device: torch.device) -> torch.autocast:
    """bfloat16 autocast where the weights are bfloat16 (the float32 rows meet them there)."""
    enabled = weights_dtype(device) == torch.bfloat16
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def batch_losses(
    model: PreTrainedModel,
    batch: Sequence[Example],
    names: Sequence[str],
    keep: torch.Tensor,
    device: torch.device,
    dense: DensePositions | None = None,
) -> tuple[dict[str, torch.Tensor], int]:
    """The batch's mean loss for each loss in `names`, all from one student forward (and one
    teacher forward for `kl` and `kl_dense`, which needs `dense`), and the answer-token count."""
    ids, mask, labels = (t.to(device) for t in collate(batch, "student"))
    answer = labels != IGNORE_INDEX
    teacher = None
    with _autocast(device):
        hidden = final_hidden(model, mask, input_ids=ids)
        logits = student_logits(model, hidden[answer])
        losses = {"ce": cross_entropy(logits, labels[answer])} if "ce" in names else {}
        if {"kl", "kl_dense"} & set(names):
            t_ids, t_mask, t_labels = (t.to(device) for t in collate(batch, "teacher"))
            t_hidden = teacher_hidden(model, t_ids, t_mask)
            teacher = teacher_logits(model, t_hidden[t_labels != IGNORE_INDEX])
        if "kl_dense" in names:
            if dense is None:
                raise ValueError("kl_dense needs the dense positions")
            s_at, t_at = (p.to(device) for p in dense(batch, ids.shape[1], t_ids.shape[1]))
            s_dense = student_logits(model, hidden.flatten(0, 1)[s_at])
            t_dense = teacher_logits(model, t_hidden.flatten(0, 1)[t_at])
    if teacher is not None:
        losses["kl"] = distillation_kl(logits, teacher, keep)
    if "kl_dense" in names:
        losses["kl_dense"] = losses["kl"] + distillation_kl(s_dense, t_dense, keep)
    return losses, logits.shape[0]


def batch_loss(
    model: PreTrainedModel,
    batch: Sequence[Example],
    loss: str,
    keep: torch.Tensor,
    device: torch.device,
    dense: DensePositions | None = None,
) -> tuple[torch.Tensor, int]:
    """The batch's mean loss (`batch_losses` of one loss), and its answer-token count."""
    losses, n = batch_losses(model, batch, (loss,), keep, device, dense)
    return losses[loss], n


@torch.no_grad()
def validation_losses(
    model: PreTrainedModel,
    examples: Sequence[Example],
    batch_size: int,
    keep: torch.Tensor,
    device: torch.device,
    dense: DensePositions | None = None,
) -> dict[str, float]:
    """Answer-token-weighted means on `examples` of every loss: `ce` (to the pseudo-labels),
    `kl` (to the original model's distributions at the answer positions) and, given `dense`,
    `kl_dense`."""
    was_training = model.training
    model.eval()
    names = LOSSES if dense is not None else tuple(n for n in LOSSES if n != "kl_dense")
    totals, count = dict.fromkeys(names, 0.0), 0
    for batch in _batches(examples, batch_size):
        losses, n = batch_losses(model, batch, names, keep, device, dense)
        for name, value in losses.items():
            totals[name] += value.item() * n
        count += n
    model.train(was_training)
    return {name: total / max(count, 1) for name, total in totals.items()}


def warmup_cosine_schedule(total_steps: int, warmup_ratio: float) -> Callable[[int], float]:
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
        writer = csv.DictWriter(
            handle, fieldnames=["step", "train_loss", "val_loss", *VAL_COLUMNS, "lr"]
        )
        writer.writeheader()
        writer.writerows(history)


@dataclass
class SSFTRun:
    """One SSFT run's moving parts."""

    model: PreTrainedModel
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    keep: torch.Tensor
    dense: DensePositions
    device: torch.device
    steps_per_epoch: int
    total_steps: int
    run_dir: Path
    config: SSFTConfig
    state: dict[str, Any]


def _steps(n_train: int, config: SSFTConfig) -> tuple[int, int]:
    """(optimizer steps per epoch, total optimizer steps)."""
    micro_per_epoch = math.ceil(n_train / config.batch_size)
    steps_per_epoch = math.ceil(micro_per_epoch / config.grad_accum)
    total = steps_per_epoch * config.epochs
    return steps_per_epoch, total if config.max_steps is None else min(total, config.max_steps)


def start_run(
    base_dir: Path,
    tokenizer: MedTPETokenizer,
    n_train: int,
    run_dir: Path,
    config: SSFTConfig,
) -> SSFTRun:
    """The split model, its optimizer and schedule, and an empty run state."""
    device = pick_device(config.device)
    torch.manual_seed(config.seed)
    initial = load_rows_file(config.init_rows)[0] if config.init_rows is not None else None
    model, params = load_split_model(base_dir, tokenizer, device, initial)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    keep = torch.ones(model.config.vocab_size, dtype=torch.bool, device=device)
    keep[[t.id for t in tokenizer.new_tokens]] = False
    steps_per_epoch, total_steps = _steps(n_train, config)
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine_schedule(total_steps, config.warmup_ratio)
    )
    state: dict[str, Any] = {"step": 0, "history": [], "bad_checks": 0, "stopped": False}
    dense = DensePositions(tokenizer, config.dense_positions)
    return SSFTRun(
        model, params, optimizer, scheduler, keep, dense, device, steps_per_epoch, total_steps,
        run_dir, config, state,
    )  # fmt: skip


def _restore(run: SSFTRun, checkpoint_path: Path) -> None:
    """Continue from a checkpoint written by `_checkpoint` with the same settings."""
    state = torch.load(checkpoint_path, map_location=run.device, weights_only=False)
    if state["config"] != asdict(run.config):
        raise ValueError(f"{checkpoint_path} was written with other settings")
    with torch.no_grad():
        for param, saved in zip(run.params, state["params"], strict=True):
            param.copy_(saved)
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    run.state = state


def _validation_row(run: SSFTRun, val: Sequence[Example]) -> dict[str, float]:
    """History columns of one validation: the run's own loss and every loss by name."""
    losses = validation_losses(
        run.model, val, run.config.batch_size, run.keep, run.device, run.dense
    )
    return {"val_loss": losses[run.config.loss]} | {f"val_{k}": v for k, v in losses.items()}


def _best_val(row: dict[str, Any]) -> dict[str, float]:
    return {name: row[f"val_{name}"] for name in LOSSES}


def _first_validation(run: SSFTRun, val: Sequence[Example]) -> None:
    """Step 0: the initialised rows' validation losses, the first best rows."""
    row = {"step": 0, "train_loss": ""} | _validation_row(run, val) | {"lr": 0.0}
    run.state.update(
        initial_val_loss=row["val_loss"],
        best_val_loss=row["val_loss"],
        best_val=_best_val(row),
        best_rows=split_rows(run.model),
    )
    run.state["history"].append(row)


def _checkpoint(run: SSFTRun) -> None:
    """Save the run state (rows, optimizer, schedule, RNG) and the history so far."""
    run.state.update(
        config=asdict(run.config),
        params=[p.detach().clone() for p in run.params],
        optimizer=run.optimizer.state_dict(),
        scheduler=run.scheduler.state_dict(),
        rng=torch.get_rng_state(),
    )
    _save_checkpoint(run.run_dir / CHECKPOINT_FILE, run.state)
    _write_history(run.run_dir / HISTORY_FILE, run.state["history"])


def optimizer_step(run: SSFTRun, step_batches: Sequence[Sequence[Example]]) -> float:
    """Accumulate the gradients of `step_batches`, step; the mean training loss."""
    step_loss = 0.0
    for batch in step_batches:
        loss, _ = batch_loss(run.model, batch, run.config.loss, run.keep, run.device, run.dense)
        (loss / len(step_batches)).backward()
        step_loss += loss.item() / len(step_batches)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return step_loss


def _validate(run: SSFTRun, row: dict[str, Any], val: Sequence[Example]) -> None:
    """Validation after a step: keep the best rows, count checks without progress (early
    stopping after `patience`), checkpoint."""
    state = run.state
    row.update(_validation_row(run, val))
    if row["val_loss"] < state["best_val_loss"]:
        state.update(
            best_val_loss=row["val_loss"],
            best_val=_best_val(row),
            best_rows=split_rows(run.model),
            bad_checks=0,
        )
    else:
        state["bad_checks"] += 1
        state["stopped"] = state["bad_checks"] >= run.config.patience
    _checkpoint(run)


def _epoch_batches(run: SSFTRun, train: Sequence[Example]) -> list[list[list[Example]]]:
    """The remaining optimizer steps' micro-batches of the current epoch (seeded order)."""
    config = run.config
    epoch, within = divmod(run.state["step"], run.steps_per_epoch)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(config.seed + epoch))
    micro = _batches([train[i] for i in order.tolist()], config.batch_size)
    return _batches(micro[within * config.grad_accum :], config.grad_accum)


def _train_loop(run: SSFTRun, train: Sequence[Example], val: Sequence[Example]) -> None:
    """Optimizer steps until the step budget or early stopping, validating every K steps."""
    state, config = run.state, run.config
    run.model.train()
    bar = tqdm(
        total=run.total_steps, initial=state["step"], desc=f"ssft[{config.loss}]", unit="step"
    )
    bar.set_postfix(val=f"{state['best_val_loss']:.4f}")
    while state["step"] < run.total_steps and not state["stopped"]:
        for step_batches in _epoch_batches(run, train):
            step_loss = optimizer_step(run, step_batches)
            state["step"] += 1
            lr = run.scheduler.get_last_lr()[0]
            row = {"step": state["step"], "train_loss": step_loss, "val_loss": "", "lr": lr}
            state["history"].append(row)
            bar.update(1)
            bar.set_postfix(loss=f"{step_loss:.4f}", val=f"{state['best_val_loss']:.4f}")
            last = state["step"] >= run.total_steps
            if state["step"] % config.eval_every == 0 or last:
                _validate(run, row, val)
            if last or state["stopped"]:
                break
    bar.close()


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
    run = start_run(base_dir, tokenizer, len(train), run_dir, config)
    checkpoint_path = run_dir / CHECKPOINT_FILE
    if resume and checkpoint_path.is_file():
        _restore(run, checkpoint_path)
    else:
        _first_validation(run, val)
    _train_loop(run, train, val)
    state = run.state
    return SSFTResult(
        rows=state["best_rows"],
        initial_val_loss=state["initial_val_loss"],
        best_val_loss=state["best_val_loss"],
        best_val=state["best_val"],
        steps=state["step"],
        stopped_early=state["stopped"],
        history=state["history"],
    )
