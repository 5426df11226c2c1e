"""Token-level distillation of the new rows (after Token Distillation, Dobler et al., ICLR 2026):
the MedTPE model reading a snippet must produce, at every point where both have read the same
text, the hidden state the original model produces reading the original tokens.

Short snippets (`medtpe.core.tokenizer.snippets`: ~64 original tokens, cut at shared ends, drawn so
every new token is seen in enough contexts) instead of whole 8k-token prompts: one snippet holds
dozens of MedTPE tokens, and each is trained in many contexts for the price of a few long
windows. The teacher (base model, original ids) runs once per snippet and its hidden states at
the aligned positions are cached (`{split}-teacher-{digest}.pt`); the student trains only the
new rows (the embedding split) with the relative squared error of the hidden states at `layers`
(the mean over them; -1 is the last layer after the final norm, what the LM head reads; without
it the forward stops at the deepest layer matched). The last layer alone leaves the middle of
the network free: there the rows learn to drive the residual stream of their positions far from
the original's (50x its error at layers 12-28 in a run on ICU text) and the answer drifts more
than before, so the default matches the middle layers too. With tied embeddings the loss trains
the input side only: `output="base"` serves the base model's own head rows for the reused ids
(the export unties the head), `"tied"` the trained rows on both sides. Optionally the KL of the
next-token distributions, at each snippet's last aligned position (`last_kl_weight`: a prompt's
answer) or at every one (`dense_kl_weight`).

A second stage (`DistillConfig.long_tokens`; the build runs it with `distill()` again on long
windows of the prompts, `medtpe.training.distill_config.long_stage`) reads long records through the
rows: the answer's drift grows with the number of merged positions read, which 64-token
snippets never show. With `long_windows: last` it reads each prompt's last window in the
artefact's own encoding, its plain tail (`MedTPETokenizer.plain_tail`) unmerged as served.

Resumable: the teacher cache and a checkpoint after every validation live in the run
directory; a re-run continues. Cost per step ≈ one forward and one backward of the student over
`batch_size` snippets (~35 MedTPE tokens each) up to the deepest layer matched.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from tqdm.auto import tqdm

from medtpe.core.tokenizer.snippets import Snippet
from medtpe.training.distill_config import FINAL_LAYER, DistillConfig, matched_layers
from medtpe.training.embedding_init import INIT_METHODS, NewRows
from medtpe.training.embedding_split import SplitEmbedding
from medtpe.training.rope_stretch import stretch_rope
from medtpe.training.ssft import load_split_model, pick_device, warmup_cosine_schedule

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from medtpe.core.tokenizer import MedTPETokenizer

TEACHER_FILE = "teacher.pt"
CHECKPOINT_FILE = "distill-checkpoint.pt"
HISTORY_FILE = "distill-history.jsonl"
TEACHER_FORMAT = 2
"""Version of the teacher cache's contents (2: `TeacherStates`), part of its file's digest."""
MAX_GRAD_NORM = 1.0
"""Gradient norm clip of a step (a batch holding an outlier position must not throw the rows)."""


@dataclass(frozen=True)
class DistillResult:
    """The best rows (by held-out loss) and the run's record."""

    rows: NewRows
    initial_val_loss: float
    best_val_loss: float
    steps: int
    seconds: dict[str, float]


class _Stop(Exception):
    """Raised by the hook that ends a forward at the layer matched."""


def hidden_at(
    model: PreTrainedModel,
    layers: Sequence[int],
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Hidden states [batch, width, hidden] at each of `layers` (see `DistillConfig.layers`), in
    that order; without the last layer, the forward stops at the deepest one asked for."""
    caught: dict[int, torch.Tensor] = {}
    deepest = max(layers) if FINAL_LAYER not in layers else None

    def keep(layer: int) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            caught[layer] = output[0] if isinstance(output, tuple) else output
            if layer == deepest:
                raise _Stop

        return hook

    blocks = model.base_model.layers
    handles = [blocks[k - 1].register_forward_hook(keep(k)) for k in layers if k != FINAL_LAYER]
    try:
        out = model.base_model(
            input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        caught[FINAL_LAYER] = out.last_hidden_state
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return [caught[k] for k in layers]


def _pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[k, : len(r)] = 1
    return ids, mask


def _flat_positions(snippets: Sequence[Snippet], width: int, side: int) -> torch.Tensor:
    """Flat indices into [batch, width] of each snippet's aligned positions (`side` 0: student,
    1: teacher)."""
    return torch.tensor(
        [k * width + pair[side] for k, s in enumerate(snippets) for pair in s.pairs],
        dtype=torch.long,
    )


class TeacherStates(NamedTuple):
    """What the original model produced reading the snippets."""

    states: torch.Tensor
    """Hidden states at the matched layers at every aligned position ([sum of pairs,
    len(layers), hidden] bfloat16, snippet by snippet: half the memory, far below the rows'
    error)."""
    last: torch.Tensor | None
    """The last layer's (normed) state at each snippet's last aligned position ([snippets,
    hidden] float32: the next-token distribution there is read from it, and bfloat16 would put
    the answer's logits on steps of ~0.1); None when the last layer is not matched."""
    final: torch.Tensor | None = None
    """The last layer's (normed) state at every aligned position ([sum of pairs, hidden]
    float32), for `DistillConfig.dense_kl_weight`; None otherwise."""


@torch.no_grad()
def teacher_states(
    model: PreTrainedModel,
    snippets: Sequence[Snippet],
    layers: Sequence[int],
    batch_size: int,
    device: torch.device,
    pad: int,
    dense: bool = False,
) -> TeacherStates:
    """The original model's hidden states at `layers` at every snippet's aligned positions,
    new rows ignored (`TeacherStates`; `dense`: the last layer's in float32 too)."""
    embedding: SplitEmbedding = model.get_input_embeddings()
    out, last, final_all = [], [], []
    for start in tqdm(range(0, len(snippets), batch_size), desc="teacher", unit="batch"):
        batch = snippets[start : start + batch_size]
        ids, mask = _pad([s.teacher for s in batch], pad)
        embeds = torch.nn.functional.embedding(ids.to(device), embedding.weight)
        hidden = hidden_at(model, layers, attention_mask=mask.to(device), inputs_embeds=embeds)
        at = _flat_positions(batch, ids.shape[1], 1).to(device)
        out.append(torch.stack([h.flatten(0, 1)[at] for h in hidden], 1).bfloat16().cpu())
        if FINAL_LAYER in layers:
            final = hidden[list(layers).index(FINAL_LAYER)]
            ends = torch.tensor([s.pairs[-1][1] for s in batch], device=device)
            last.append(final[torch.arange(len(batch), device=device), ends].float().cpu())
            if dense:
                final_all.append(final.flatten(0, 1)[at].float().cpu())
    return TeacherStates(
        torch.cat(out),
        torch.cat(last) if last else None,
        torch.cat(final_all) if final_all else None,
    )


def _offsets(snippets: Sequence[Snippet]) -> list[int]:
    """Start of each snippet's rows in the teacher cache."""
    offsets = [0]
    for s in snippets:
        offsets.append(offsets[-1] + len(s.pairs))
    return offsets


def relative_error(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Squared error of aligned hidden states [N, layers, hidden], each relative to the
    teacher's own squared norm at that position and layer, averaged. Per position, because a
    few positions carry massive activations (norms 10-50x the rest in the middle layers): a
    plain mean squared error is theirs alone, spikes whenever one is missed, and drove a run's
    held-out error up instead of down."""
    return ((student - teacher).pow(2).sum(-1) / teacher.pow(2).sum(-1).clamp_min(1e-6)).mean()


def next_token_kl(
    model: PreTrainedModel, student: torch.Tensor, teacher: torch.Tensor
) -> torch.Tensor:
    """KL(original || MedTPE) of the next-token distributions read through the LM head from
    last-layer states [N, hidden] of both sides, the mean over the N positions."""
    head = model.get_output_embeddings()
    mine = torch.log_softmax(head(student).float(), -1)
    theirs = torch.log_softmax(head(teacher.to(student.device, student.dtype)).float(), -1)
    return torch.nn.functional.kl_div(mine, theirs, log_target=True, reduction="batchmean")


class _Targets(NamedTuple):
    """The teacher's states a batch is matched against (`TeacherStates`, the batch's rows)."""

    states: torch.Tensor
    last: torch.Tensor | None
    final: torch.Tensor | None


def _targets(teacher: TeacherStates, picked: Sequence[int], offsets: Sequence[int]) -> _Targets:
    """The rows of the `picked` snippets in `teacher` (`offsets`: `_offsets` of its snippets)."""
    spans = [slice(offsets[k], offsets[k + 1]) for k in picked]
    final = None if teacher.final is None else torch.cat([teacher.final[s] for s in spans])
    last = None if teacher.last is None else teacher.last[list(picked)]
    return _Targets(torch.cat([teacher.states[s] for s in spans]), last, final)


def _batch_loss(
    model: PreTrainedModel,
    batch: Sequence[Snippet],
    targets: _Targets,
    config: DistillConfig,
    device: torch.device,
    pad: int,
) -> torch.Tensor:
    """The relative error of the hidden states, plus `config.last_kl_weight` times the KL of
    the next-token distributions at each snippet's last aligned position and
    `config.dense_kl_weight` times their KL at every aligned position."""
    ids, mask = _pad([s.student for s in batch], pad)
    layers = config.layers
    hidden = hidden_at(model, layers, input_ids=ids.to(device), attention_mask=mask.to(device))
    at = _flat_positions(batch, ids.shape[1], 0).to(device)
    student = torch.stack([h.flatten(0, 1)[at] for h in hidden], 1).float()
    loss = relative_error(student, targets.states.to(device).float())
    if not (config.last_kl_weight or config.dense_kl_weight):
        return loss
    final = hidden[list(layers).index(FINAL_LAYER)]
    if config.last_kl_weight:
        ends = torch.tensor([s.pairs[-1][0] for s in batch], device=device)
        mine = final[torch.arange(len(batch), device=device), ends]
        loss = loss + config.last_kl_weight * next_token_kl(model, mine, targets.last)
    if config.dense_kl_weight:
        mine = final.flatten(0, 1)[at]
        loss = loss + config.dense_kl_weight * next_token_kl(model, mine, targets.final)
    return loss


@torch.no_grad()
def _validate(
    model: PreTrainedModel,
    snippets: Sequence[Snippet],
    teacher: TeacherStates,
    config: DistillConfig,
    device: torch.device,
    pad: int,
) -> float:
    offsets = _offsets(snippets)
    total, count = 0.0, 0
    for start in range(0, len(snippets), config.batch_size):
        batch = snippets[start : start + config.batch_size]
        targets = _targets(teacher, range(start, start + len(batch)), offsets)
        loss = _batch_loss(model, batch, targets, config, device, pad)
        total += loss.item() * len(batch)
        count += len(batch)
    return total / max(count, 1)


def _cached_teacher(
    path: Path,
    model: PreTrainedModel,
    snippets: Sequence[Snippet],
    config: DistillConfig,
    device: torch.device,
    pad: int,
) -> TeacherStates:
    """The teacher states of `snippets`, read from `path` when a run already computed them for
    the same snippets and layers (a digest of both names the file; with the dense KL's
    float32 states, a name of its own)."""
    dense = bool(config.dense_kl_weight)
    named = [TEACHER_FORMAT, config.layers, [s.to_json() for s in snippets]] + ["dense"] * dense
    key = hashlib.sha256(json.dumps(named).encode()).hexdigest()[:12]
    path = path.with_name(f"{path.stem}-{key}{path.suffix}")
    if path.is_file():
        return TeacherStates(**torch.load(path))
    states = teacher_states(model, snippets, config.layers, config.batch_size, device, pad, dense)
    tmp = path.with_suffix(".tmp")
    torch.save(states._asdict(), tmp)
    os.replace(tmp, path)
    return states


def distill(
    base_dir: Path,
    tokenizer: MedTPETokenizer,
    train: Sequence[Snippet],
    val: Sequence[Snippet],
    run_dir: Path,
    config: DistillConfig,
    initial: NewRows | None = None,
    *,
    seed: int = 1,
    device: str | None = None,
) -> DistillResult:
    """Train the new rows by token-level distillation (module docstring) from `initial` (None:
    the rows `config.start` names: the constituents' mean or their last's); resumes from
    `run_dir`. Returns the rows best on `val`, with the output side `config.output` asks for
    (`base`: the base head's rows of the reused ids)."""
    device = pick_device(device)
    torch.manual_seed(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    init = config.start if config.start in INIT_METHODS else "mean"
    model, params = load_split_model(base_dir, tokenizer, device, _input_only(initial), init)
    config = replace(config, layers=matched_layers(config.layers, model.config.num_hidden_layers))
    pad = 0  # any id: padded positions are masked and never read
    teacher = {
        split: _cached_teacher(
            run_dir / f"{split}-{TEACHER_FILE}", model, snippets, config, device, pad
        )
        for split, snippets in (("train", train), ("val", val))
    }
    teacher_s = time.perf_counter() - started
    stretch_rope(model, config.rope_stretch)  # the teacher read plain RoPE; the student may not
    norm_cap = float(model.get_input_embeddings().weight.float().norm(dim=1).max())
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    steps_per_epoch = math.ceil(len(train) / config.batch_size)
    total = steps_per_epoch * config.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine_schedule(total, config.warmup_ratio)
    )
    checkpoint = run_dir / CHECKPOINT_FILE
    state = _restored(checkpoint, params[0], optimizer, scheduler)
    if state["initial"] is None:
        state["initial"] = state["best"] = _validate(
            model, val, teacher["val"], config, device, pad
        )
        state["best_rows"] = params[0].detach().cpu().clone()
        _log(run_dir, {"step": 0, "val_loss": state["initial"]})
    order = _order(len(train), config.epochs, seed)
    offsets = _offsets(train)
    model.eval()  # no dropout; the rows still get their gradients
    bar = tqdm(total=total, initial=state["step"], desc="distill", unit="step")
    train_started = time.perf_counter()
    while state["step"] < total:
        step = state["step"]
        picked = order[step * config.batch_size : (step + 1) * config.batch_size]
        batch = [train[k] for k in picked]
        targets = _targets(teacher["train"], picked, offsets)
        loss = _batch_loss(model, batch, targets, config, device, pad)
        _step(loss, params, optimizer, scheduler, norm_cap)
        state["step"] += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}")
        row = {"step": state["step"], "train_loss": loss.item(), "lr": scheduler.get_last_lr()[0]}
        if state["step"] % config.eval_every == 0 or state["step"] == total:
            row["val_loss"] = _validate(model, val, teacher["val"], config, device, pad)
            if row["val_loss"] < state["best"]:
                state["best"], state["best_rows"] = (
                    row["val_loss"],
                    params[0].detach().cpu().clone(),
                )
            _save(checkpoint, params[0], optimizer, scheduler, state)
        _log(run_dir, row)
    bar.close()
    return DistillResult(
        _result_rows(state["best_rows"], config),
        state["initial"],
        state["best"],
        state["step"],
        {"teacher": round(teacher_s, 1), "train": round(time.perf_counter() - train_started, 1)},
    )


def _step(
    loss: torch.Tensor,
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    norm_cap: float,
) -> None:
    """One optimiser step on a batch's `loss`: its gradients clipped to `MAX_GRAD_NORM`, the
    rows' norms capped at `norm_cap` after it."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
    optimizer.step()
    _cap_norms(params[0], norm_cap)
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def _log(run_dir: Path, row: dict[str, Any]) -> None:
    """Append one row (a step's losses) to the run's history."""
    with (run_dir / HISTORY_FILE).open("a") as handle:
        handle.write(json.dumps(row) + "\n")


def _result_rows(best: torch.Tensor, config: DistillConfig) -> NewRows:
    """The rows best on `val` with the output side `config.output` asks for (`base`: the base
    head's rows of the reused ids, `NewRows.output_base`)."""
    return NewRows(best, rope_stretch=config.rope_stretch, output_base=config.output == "base")


@torch.no_grad()
def _cap_norms(rows: torch.Tensor, cap: float) -> None:
    """Scale down any row longer than `cap` (the longest base row): a new row far longer than
    every base embedding drives its positions into massive activations the original never has
    there (seen as loss spikes of 10-25 in the middle layers)."""
    norms = rows.norm(dim=1, keepdim=True)
    rows.mul_((cap / norms.clamp_min(1e-12)).clamp(max=1.0))


def _input_only(rows: NewRows | None) -> NewRows | None:
    """Distillation trains the input rows: an initial output side is not carried."""
    return None if rows is None else NewRows(rows.input)


def _order(n: int, epochs: int, seed: int) -> list[int]:
    """The snippets' seeded order over all epochs (a new permutation each epoch)."""
    generator = torch.Generator().manual_seed(seed)
    return [int(k) for _ in range(epochs) for k in torch.randperm(n, generator=generator)]


def _save(
    path: Path,
    rows: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    state: dict[str, Any],
) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "rows": rows.detach().cpu(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "state": state,
        },
        tmp,
    )
    os.replace(tmp, path)


def _restored(
    path: Path,
    rows: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
) -> dict[str, Any]:
    """The run's state (`step`, the `best` held-out loss and its rows, the `initial` one): a new
    run's, or the checkpoint's at `path`, whose rows, optimizer and scheduler are restored."""
    if not path.is_file():
        return {"step": 0, "best": None, "best_rows": None, "initial": None}
    saved = torch.load(path, weights_only=False)
    with torch.no_grad():
        rows.copy_(saved["rows"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    return saved["state"]


def best_rows(run_dir: Path) -> torch.Tensor:
    """The best input rows (by held-out loss) a run directory's checkpoint holds (float32)."""
    saved = torch.load(Path(run_dir) / CHECKPOINT_FILE, weights_only=False)
    return saved["state"]["best_rows"].float()


def summary(result: DistillResult, config: DistillConfig) -> dict[str, Any]:
    """A JSON-ready record of a run."""
    return {
        "settings": asdict(config),
        "initial_val_loss": result.initial_val_loss,
        "best_val_loss": result.best_val_loss,
        "steps": result.steps,
        "seconds": result.seconds,
    }
