"""The checkpoints a served model reads, and the checks that they were prepared offline.

Serving never writes a checkpoint: the base checkpoint comes from `medtpe prepare-model` (the
default model) or from the operator, the exported one (base weights + an artefact's rows and
tokenizer files) from `medtpe export`, which leaves `EXPORT_STAMP` naming the digest of the
artefact it was exported from (`medtpe.core.tokenizer.artefact_manifest.content_digest`). A missing
or stale file is a `ModelFilesMissing` naming the command that writes it.
"""

from __future__ import annotations

from pathlib import Path

from medtpe.core.paths import default_model_dir
from medtpe.core.tokenizer.artefact_manifest import content_digest

EXPORT_STAMP = ".medtpe-source"
"""File in an export directory naming the digest of the artefact it was exported from."""


class ModelFilesMissing(FileNotFoundError):
    """A checkpoint the model needs is missing or stale; the message names the command to run."""


def export_is_current(artefact_dir: Path, export_dir: Path) -> bool:
    """True when `export_dir` was exported from the artefact `artefact_dir` holds now."""
    stamp = Path(export_dir) / EXPORT_STAMP
    return stamp.is_file() and stamp.read_text().strip() == content_digest(artefact_dir)


def check_base_model(model_dir: Path) -> Path:
    """`model_dir` if it is a Hugging Face checkpoint, else `ModelFilesMissing`."""
    model_dir = Path(model_dir)
    if (model_dir / "config.json").is_file():
        return model_dir
    if model_dir.resolve() == default_model_dir().resolve():
        fix = "run `medtpe prepare-model` (or `make model`) to convert the default model"
    else:
        fix = (
            "point the model directory at a Hugging Face checkpoint, or run "
            f"`medtpe prepare-model --out {model_dir}` to convert the default model there"
        )
    raise ModelFilesMissing(f"no base checkpoint at {model_dir} (no config.json): {fix}")


def check_export(base_dir: Path, artefact_dir: Path, export_dir: Path) -> Path:
    """`export_dir` if it was exported from `artefact_dir` as it is now, else
    `ModelFilesMissing` naming the `medtpe export` command that writes it."""
    export_dir = Path(export_dir)
    if export_is_current(artefact_dir, export_dir):
        return export_dir
    if not (export_dir / EXPORT_STAMP).is_file():
        why = f"no exported checkpoint at {export_dir}"
    else:
        why = (
            f"the exported checkpoint at {export_dir} is stale (its {EXPORT_STAMP} names "
            f"another artefact than the one in {artefact_dir})"
        )
    raise ModelFilesMissing(
        f"{why}: run `medtpe export --base {base_dir} --medtpe {artefact_dir} --out {export_dir}`"
    )
