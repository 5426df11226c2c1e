"""`medtpe evaluate`: a task's labelled records through the service's engine, original vs MedTPE.

The engine (vLLM, torch) is imported inside the command, so loading the CLI stays light.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import meds

from medtpe.cli import options
from medtpe.inference.engines.protocol import Dtype
from medtpe.inference.model import ModelConfig

if TYPE_CHECKING:
    from medtpe.inference.model import LoadedModel
    from medtpe.inference.sampling import Sampling

MODE_ORDER = {"original": ("original",), "medtpe": ("medtpe",), "both": ("original", "medtpe")}


def predictions_paths(path: Path, modes: tuple[str, ...]) -> dict[str, Path]:
    """Where each mode's predictions go: `path` for one mode, `<stem>.<mode><suffix>` beside it
    for both."""
    if len(modes) == 1:
        return {modes[0]: path}
    return {mode: path.with_name(f"{path.stem}.{mode}{path.suffix}") for mode in modes}


def _subject_ids(value: str | None) -> set[int] | None:
    """Subject ids from a comma-separated list or a file holding one id per line."""
    if value is None:
        return None
    path = Path(value)
    text = path.read_text() if path.is_file() else value
    try:
        return {int(item) for item in text.replace(",", "\n").split() if item}
    except ValueError as exc:
        raise click.BadParameter(
            f"subject ids must be integers ({exc})", param_hint="--subjects"
        ) from exc


@click.command("evaluate")
@options.MEDS_DIR_OPTION
@click.option(
    "--labels", "labels_path", required=True, type=click.Path(exists=True, path_type=Path)
)
@options.TASK_OPTION
@click.option("--mode", type=click.Choice(list(MODE_ORDER)), default="both", show_default=True)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="First N label rows.")
@click.option(
    "--subjects",
    default=None,
    help="Only these subjects: comma-separated ids or a file with one id per line.",
)
@options.split_option(meds.held_out_split, "; 'all' for every subject")
@options.SAMPLING_OPTIONS
@options.model_options(
    "max_input_tokens", "max_new_tokens", "window_policy", "window_grid_hours", "prompt_layout"
)
@click.option(
    "--prefill/--no-prefill",
    default=True,
    show_default=True,
    help="Start the answer with the task's JSON opening (the service's setting); "
    "--no-prefill lets the model write the whole answer (the paper's setting).",
)
@options.MODEL_FILES_OPTIONS
@options.model_options("kv_cache_gib", "seed", "dtype", "enforce_eager")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--predictions-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a meds-evaluation predictions.parquet (with --mode both: one per mode, "
    "FILE.original.parquet and FILE.medtpe.parquet).",
)
def evaluate(
    meds_dir: Path,
    labels_path: Path,
    task_name: str,
    mode: str,
    limit: int | None,
    subjects: str | None,
    split: str,
    n_samples: int,
    temperature: float | None,
    max_input_tokens: int,
    max_new_tokens: int,
    window_policy: str,
    window_grid_hours: int,
    prompt_layout: str,
    prefill: bool,
    constrained: bool,
    model_dir: Path | None,
    artefact_dir: Path | None,
    export_dir: Path | None,
    kv_cache_gib: float,
    seed: int,
    dtype: Dtype,
    enforce_eager: bool,
    out_path: Path,
    predictions_out: Path | None,
) -> None:
    """Evaluate a task with the original and/or MedTPE tokenizer; writes a JSON report."""
    from medtpe.core.tasks import get_task
    from medtpe.evaluation.figures import build_report, format_table
    from medtpe.evaluation.predictions import write_predictions
    from medtpe.evaluation.records import load_records
    from medtpe.evaluation.runner import run_modes

    task = get_task(task_name).model_copy(update={"prefill_answer": prefill})
    records = load_records(
        meds_dir,
        labels_path,
        task,
        subjects=_subject_ids(subjects),
        split=options.split_name(split),
        limit=limit,
    )
    if not records:
        raise click.UsageError("no labelled records to evaluate")
    sampling = options.sampling(n_samples, temperature, max_new_tokens, constrained)
    configs = _prepared_configs(
        MODE_ORDER[mode],
        **options.model_files(model_dir, artefact_dir, export_dir),
        codes_dir=meds_dir,
        max_input_tokens=max_input_tokens,
        max_new_tokens=max_new_tokens,
        window_policy=window_policy,
        window_grid_hours=window_grid_hours,
        prompt_layout=prompt_layout,
        kv_cache_gib=kv_cache_gib,
        seed=seed,
        dtype=dtype,
        enforce_eager=enforce_eager,
    )
    results, used = asyncio.run(run_modes(configs, task, records, sampling))
    budget = used[0].predictor.max_input_tokens
    settings = _report_settings(
        click.get_current_context().params, task.name, len(records), budget, sampling, used
    )
    report = build_report(task, results, settings=settings)
    report.write(out_path)
    click.echo(f"{task.title}: {len(records)} records, input budget {budget} original tokens")
    click.echo(format_table(report))
    click.echo(f"report: {out_path}")
    if predictions_out is not None:
        for name, path in predictions_paths(predictions_out, MODE_ORDER[mode]).items():
            write_predictions(task, records, results[name], path)
            click.echo(f"predictions ({name}): {path}")


def _prepared_configs(modes: tuple[str, ...], **settings: Any) -> list[ModelConfig]:
    """The model of each of `modes` with the options `settings`, its files prepared (the
    default model converted, the export written) before any engine starts."""
    from medtpe.training.export import prepare_model_files

    configs = [ModelConfig.from_options(**settings, mode=name) for name in modes]
    for config in configs:
        prepare_model_files(config)
    return configs


REPORTED_OPTIONS = (
    "max_new_tokens",
    "window_policy",
    "window_grid_hours",
    "prompt_layout",
    "prefill",
    "constrained",
    "seed",
    "dtype",
    "enforce_eager",
)
"""The options of `medtpe evaluate` a report's settings record as given."""


def _report_settings(
    params: dict[str, Any],
    task: str,
    n_records: int,
    budget: int,
    sampling: Sampling,
    used: list[LoadedModel],
) -> dict[str, Any]:
    """The settings a report of `medtpe evaluate` records: the inputs of the command's `params`,
    the records' count, the input budget the models used, the decoding, the `REPORTED_OPTIONS`
    and each mode's model."""
    from medtpe.core.meds.readers import read_dataset_metadata

    return {
        "task": task,
        "meds": str(params["meds_dir"]),
        "labels": str(params["labels_path"]),
        "meds_version": read_dataset_metadata(params["meds_dir"]).get(
            meds.DatasetMetadataSchema.meds_version_name
        ),
        "split": params["split"],
        "n_records": n_records,
        "max_input_tokens": budget,
        "n_samples": sampling.n_samples,
        "temperature": sampling.temperature,
        **{name: params[name] for name in REPORTED_OPTIONS},
        "models": {model.identity.mode: asdict(model.identity) for model in used},
    }


commands = [evaluate]
