"""`medtpe labels`: a task's MEDS label file from a MEDS dataset (built-in definitions or ACES)."""

from __future__ import annotations

from pathlib import Path

import click

from medtpe.cli.options import INPUT_FILE, MEDS_DIR_OPTION, TaskName, one_line


def label_definitions() -> list[str]:
    """The tasks whose labels `medtpe labels` derives from a dataset's events."""
    from medtpe.core.meds.labels import LABEL_FUNCTIONS

    return list(LABEL_FUNCTIONS)


@click.command("labels")
@MEDS_DIR_OPTION
@click.option(
    "--task",
    "task_name",
    type=TaskName(label_definitions, "label definition"),
    default=None,
    help="Built-in label definition: icu_mortality, phenotyping, readmission_30d, "
    "pancreatic_cancer_1y.",
)
@click.option(
    "--aces-config",
    type=INPUT_FILE,
    default=None,
    help="An ACES task configuration instead of --task (needs the es-aces package); binary "
    "labels. medtpe/core/meds/labels/aces/ has one for icu_mortality.",
)
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Output MEDS label file (.parquet).",
)
def labels(meds_dir: Path, task_name: str | None, aces_config: Path | None, out_path: Path) -> None:
    """Write a MEDS label file: one row per prediction (subject_id, prediction_time and the
    label in boolean_value, or the phenotype names joined by '|' in categorical_value). Each row
    asks for a prediction from the data up to and including its prediction_time."""
    import pyarrow.parquet as pq

    from medtpe.core.meds.labels import derive_labels, write_labels
    from medtpe.core.meds.labels.aces_labels import AcesUnavailable, aces_labels
    from medtpe.core.meds.readers import MedsDataset, MedsFormatError
    from medtpe.core.tasks import get_task

    if (task_name is None) == (aces_config is None):
        raise click.UsageError("give exactly one of --task and --aces-config")
    try:
        dataset = MedsDataset.load(meds_dir)
    except MedsFormatError as exc:
        raise click.UsageError(f"--meds: {exc}") from exc
    version = dataset.meds_version or "not declared"
    if aces_config is not None:
        try:
            table = aces_labels(aces_config, meds_dir)
        except AcesUnavailable as exc:
            raise click.UsageError(str(exc)) from exc
        except ValueError as exc:  # ACES refuses the configuration
            raise click.BadParameter(one_line(str(exc)), param_hint="--aces-config") from exc
        out_path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, out_path)
    else:
        table = write_labels(
            derive_labels(dataset, get_task(task_name)), get_task(task_name), out_path
        )
    click.echo(f"{table.num_rows} label rows (dataset MEDS version: {version}) -> {out_path}")


commands = [labels]
