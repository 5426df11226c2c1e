"""Settings of token-level distillation (`medtpe.training.token_distillation`), without torch: the
build settings (`medtpe.training.build_config`) and the CLI read them without loading it."""

from __future__ import annotations

from dataclasses import dataclass, replace

OUTPUT_SIDES = ("base", "tied")
"""How the reused ids' output (LM head) rows are served: `base` keeps the base model's own rows
there (the export unties the head), `tied` serves the trained input rows on both sides."""
FINAL_LAYER = -1
LONG_WINDOWS = ("any", "last")
"""Which long windows the second stage reads: `any` window cut from the prompts (drawn like the
snippets), or each prompt's `last` (the one ending at its answer position, in the artefact's
own encoding: a plain tail stays unmerged), the first `long_snippets` in the windows' order."""
STARTS = ("mean", "last", "init_from")
"""Where distillation starts: the constituents' mean (the paper's initialisation), the last
constituent's row (`medtpe.training.embedding_init`), or the rows of the build's `init_from`
artefact."""


@dataclass(frozen=True)
class DistillConfig:
    """Distillation settings (defaults: snippets only, plain RoPE; the default artefact's own
    are in `artefacts/smollm2-135m-icu/build.yaml`)."""

    snippets: int = 2400
    """Training snippets drawn (frequency-aware) from the training split's prompts."""
    val_snippets: int = 128
    """Held-out snippets (the validation split's prompts) that pick the best rows."""
    snippet_tokens: int = 64
    """Original tokens per snippet (at least; each ends at the next shared end)."""
    min_contexts: int = 8
    """Snippets drawn first so that every new token the prompts hold is seen in this many."""
    layers: tuple[int, ...] | None = None
    """The hidden states matched (the mean of their relative errors): -1 the last layer after
    the final norm, k ≥ 1 layer k's output; None: every fifth of the depth and the last
    (`matched_layers`: 6, 12, 18, 24 and -1 for a 30-layer model)."""
    lr: float = 5e-3
    batch_size: int = 16
    epochs: int = 2
    warmup_ratio: float = 0.05
    eval_every: int = 25
    output: str = "base"
    start: str = "mean"
    last_kl_weight: float = 0.0
    """Weight of the KL divergence of the next-token distributions (original || MedTPE, read
    through the LM head from the last layer) at each snippet's last aligned position, added to
    the hidden states' error: for a prompt's last snippet that position is the answer's. The
    hidden states' error weighs every direction alike, while the answer reads one: matching
    them alone narrowed the answer's spread and left its shared shift (docs/benchmarks.md,
    Fidelity). Needs the last layer among `layers`."""
    dense_kl_weight: float = 0.0
    """Weight of the same KL at **every** aligned position, not only the last (the mean over
    them): what the model predicts after each point of the text, which every later merged key
    and the answer's whole context shape, rather than the answer of the training prompts alone
    (the answer's KL on 48 prompts fitted those prompts and moved held-out answers more,
    docs/benchmarks.md, Fidelity). The teacher's last-layer states are then cached in float32
    at every aligned position (hidden size x 4 bytes each). Needs the last layer among
    `layers`."""
    rope_stretch: float | None = None
    """The student reads with RoPE's slow dimensions stretched by this (> 1;
    `medtpe.core.rope_stretch`), the teacher at plain RoPE: rows for a model served with that
    stretch, whose answer sits about where the original prompt's does (docs/benchmarks.md,
    Fidelity). None: plain RoPE on both sides."""
    long_tokens: int | None = None
    """A second stage over long windows of this many original tokens (None: none), started
    from the short snippets' best rows: short snippets never read a long record through the
    new rows, and the answer's drift grows with the length read (docs/benchmarks.md,
    Fidelity). The same loss over every aligned position of windows cut from the prompts at
    least this long, a prompt's last window ending at its answer position; one per step."""
    long_snippets: int = 32
    """Long windows of the second stage (training split)."""
    long_windows: str = "any"
    """Which: `LONG_WINDOWS`."""
    long_val_snippets: int = 8
    """Held-out long windows (validation split) that pick the second stage's best rows."""

    def __post_init__(self) -> None:
        if self.output not in OUTPUT_SIDES:
            raise ValueError(f"output: expected one of {OUTPUT_SIDES}, not {self.output!r}")
        if self.long_windows not in LONG_WINDOWS:
            raise ValueError(
                f"long_windows: expected one of {LONG_WINDOWS}, not {self.long_windows!r}"
            )
        if self.start not in STARTS:
            raise ValueError(f"start: expected one of {STARTS}, not {self.start!r}")
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(self.layers))
            if not self.layers or any(k == 0 or k < FINAL_LAYER for k in self.layers):
                raise ValueError("layers: expected -1 (the last, normed) or layer numbers from 1")
        for name in ("last_kl_weight", "dense_kl_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected 0 or more")
            if getattr(self, name) and self.layers is not None and FINAL_LAYER not in self.layers:
                raise ValueError(f"{name}: needs the last layer (-1) among layers")
        if self.rope_stretch is not None and self.rope_stretch <= 1:
            raise ValueError("rope_stretch: expected more than 1 (or none)")
        if self.long_tokens is not None and self.long_tokens <= self.snippet_tokens:
            raise ValueError("long_tokens: expected more tokens than snippet_tokens")
        names = ("snippets", "val_snippets", "snippet_tokens", "batch_size", "epochs")
        for name in (*names, "long_snippets", "long_val_snippets"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected at least 1")
        if self.lr <= 0:
            raise ValueError("lr: expected a positive learning rate")


def long_stage(config: DistillConfig) -> DistillConfig | None:
    """The settings of the second stage (`DistillConfig.long_tokens`): its windows in place of
    the snippets, one per step, a validation every quarter of the run; None without one.

    >>> long_stage(DistillConfig(long_tokens=3072, long_snippets=40)).batch_size
    1
    """
    if config.long_tokens is None:
        return None
    return replace(
        config,
        snippet_tokens=config.long_tokens,
        snippets=config.long_snippets,
        val_snippets=config.long_val_snippets,
        batch_size=1,
        epochs=1,
        eval_every=max(1, config.long_snippets // 4),
        long_tokens=None,
    )


def matched_layers(layers: tuple[int, ...] | None, depth: int) -> tuple[int, ...]:
    """The layers a model of `depth` layers is matched at (`DistillConfig.layers`); ValueError
    for a layer deeper than the model.

    >>> matched_layers(None, 30)
    (6, 12, 18, 24, -1)
    """
    if layers is None:
        return (*sorted({depth * k // 5 for k in range(1, 5)} - {0, depth}), FINAL_LAYER)
    if max(layers) > depth:
        raise ValueError(f"layers: the model has {depth} layers, not {max(layers)}")
    return layers
