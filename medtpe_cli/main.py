"""The `medtpe` command: one click group, each layer contributes its own subcommands.

Subcommand modules import their heavy dependencies (torch, vLLM) lazily, inside the command
functions, so `medtpe tokenize` stays fast and torch-free.
"""

from __future__ import annotations

import importlib

import click

# Modules that define a `commands: list[click.Command]`; missing ones are skipped while
# the project grows, so each layer registers itself by adding its module here.
_COMMAND_MODULES = (
    "medtpe_cli.tokenizer_commands",
    "medtpe_cli.meds_commands",
    "medtpe_cli.labels_commands",
    "medtpe_cli.training_commands",
    "medtpe_cli.service_commands",
    "medtpe_cli.evaluation_commands",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """MedTPE: lossless prompt compression for clinical LLM predictions."""


for _name in _COMMAND_MODULES:
    try:
        _module = importlib.import_module(_name)
    except ModuleNotFoundError as exc:  # module not written yet
        if exc.name != _name:
            raise
        continue
    for _command in _module.commands:
        cli.add_command(_command)


def main() -> None:
    """Console-script entry point."""
    cli()
