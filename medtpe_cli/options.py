"""Click options shared by several commands (`render`, `evaluate`, `predict`, `labels`): one
definition each, so their names, defaults and help read the same everywhere."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import meds

from medtpe_core.paths import default_artefact_dir, default_export_dir, default_model_dir

F = TypeVar("F", bound=Callable[..., Any])

MEDS_DIR_OPTION = click.option(
    "--meds",
    "meds_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="MEDS dataset directory (data/, metadata/).",
)
"""The `--meds DIR` option of the commands that read a MEDS dataset."""
ALL_SPLITS = "all"
SPLITS = (meds.train_split, meds.tuning_split, meds.held_out_split, ALL_SPLITS)
"""`--split` choices: a split of `metadata/subject_splits.parquet`, or every subject."""

TASK_OPTION = click.option(
    "--task",
    "task_name",
    required=True,
    envvar="MEDTPE_TASK",
    help="Task name (e.g. icu_mortality); default: $MEDTPE_TASK (MEDS-DEV's model.yaml uses it).",
)
"""`--task NAME` of the commands that score a task (MEDS-DEV sets $MEDTPE_TASK)."""


def split_option(default: str, note: str = "") -> Callable[[F], F]:
    """`--split` (one of `SPLITS`), defaulting to `default`; `note` ends its help."""
    return click.option(
        "--split",
        type=click.Choice(SPLITS),
        default=default,
        show_default=True,
        help="Only the subjects of this split of metadata/subject_splits.parquet (ignored when the "
        f"dataset has none){note}.",
    )


def together(*options: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator applying `options`, listed in `--help` in this order."""

    def apply(function: F) -> F:
        for option in reversed(options):
            function = option(function)
        return function

    return apply


SAMPLING_OPTIONS = together(
    click.option("--n-samples", type=click.IntRange(min=1), default=1, show_default=True),
    click.option(
        "--temperature",
        type=click.FloatRange(min=0.0),
        default=None,
        help="Sampling temperature [default: 0 for one sample, 0.7 for majority voting].",
    ),
    click.option(
        "--constrained/--free",
        default=False,
        show_default=True,
        help="Constrain decoding to well-formed answers (vLLM structured outputs).",
    ),
)
"""`--n-samples`, `--temperature` (see `sampling_temperature`) and `--constrained/--free`."""


def sampling_temperature(n_samples: int, temperature: float | None) -> float:
    """`--temperature`, or its default: 0 (greedy) for one sample, 0.7 for majority voting."""
    if temperature is not None:
        return temperature
    return 0.0 if n_samples == 1 else 0.7


MODEL_FILES_OPTIONS = together(
    click.option("--model", "model_dir", type=click.Path(path_type=Path), default=None),
    click.option("--artefact", "artefact_dir", type=click.Path(path_type=Path), default=None),
    click.option(
        "--export-dir",
        type=click.Path(path_type=Path),
        default=None,
        help="Exported MedTPE checkpoint (written from --model and --artefact when missing or "
        "stale).",
    ),
)
"""`--model`, `--artefact` and `--export-dir` (see `model_files`)."""


def model_files(
    model_dir: Path | None, artefact_dir: Path | None, export_dir: Path | None
) -> dict[str, Path]:
    """The `ModelConfig` paths of `MODEL_FILES_OPTIONS`, each defaulting to the default model's."""
    return {
        "model_dir": model_dir or default_model_dir(),
        "artefact_dir": artefact_dir or default_artefact_dir(),
        "export_dir": export_dir or default_export_dir(),
    }
