"""`medtpe predict`: the batch job scoring a whole MEDS dataset into meds-evaluation predictions,
in this process (`evaluation.batch`) or on a Ray cluster (`--ray`, `evaluation.ray_batch`).

The model settings default to the service's and read the same `MEDTPE_*` variables (budget, answer
length, KV cache, concurrency, eager engine), so a MEDS-DEV run, which passes only directories,
is configured from its environment.

The engine (vLLM, torch) and Ray are imported inside the command, so loading the CLI stays light.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import click

from medtpe_cli import options
from medtpe_cli.ray_option import ray_option
from medtpe_core.ray_cluster import LOCAL, RayUnavailableError, check_ray_installed

LAST_EVENT = "last"
"""`--times` value: one minute after each subject's last event (the service's default)."""


def _prediction_time(value: str) -> datetime | None:
    if value == LAST_EVENT:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError as exc:
        raise click.BadParameter(
            f"{value!r} is neither '{LAST_EVENT}' nor an ISO date-time", param_hint="--times"
        ) from exc


def _partition(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    index, _, count = value.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise click.BadParameter(f"{value!r} is not I/N with 0 <= I < N", param_hint="--partition")
    return int(index), int(count)


RAY_RESOURCE_OPTIONS = options.together(
    *(
        click.option(
            name,
            type=kind,
            default=default,
            show_default=default is not None,
            help=f"With --ray: {text}",
        )
        for name, kind, default, text in (
            ("--engines", click.IntRange(min=1), 1, "generation actors, each holding one engine."),
            (
                "--cpu-workers",
                click.IntRange(min=1),
                1,
                "CPU actors reading shards, rendering and MedTPE-encoding records.",
            ),
            (
                "--engine-cpus",
                click.FloatRange(min=0.0),
                1.0,
                "CPUs Ray reserves for each generation actor.",
            ),
            (
                "--engine-gpus",
                click.FloatRange(min=0.0),
                0.0,
                "GPUs Ray reserves for each generation actor (1 on a GPU cluster).",
            ),
        )
    ),
    click.option(
        "--ray-cpus",
        type=click.IntRange(min=1),
        default=None,
        help="With --ray alone: CPUs of the local cluster [default: this machine's].",
    ),
)
"""The Ray job's resources (`evaluation.ray_batch.RayResources`)."""


SERVICE_SETTING_OPTIONS = options.model_options(
    "max_input_tokens",
    "max_new_tokens",
    "max_num_seqs",
    "kv_cache_gib",
    "enforce_eager",
    env=True,
    max_num_seqs="Records in flight to one engine (also its `max_num_seqs`).",
)
"""The model and engine options the service reads from the same `MEDTPE_*` variables, with
their declared defaults."""


@click.command("predict")
@options.MEDS_DIR_OPTION
@click.option(
    "--labels",
    "labels_path",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="MEDS label file (or directory of them): one record per row, scored at its "
    "prediction_time; its values become boolean_value. Or give --times.",
)
@click.option(
    "--times",
    multiple=True,
    help=f"Without labels: score every subject at this time (ISO date-time, or '{LAST_EVENT}': "
    "one minute after the subject's last event); repeat for several.",
)
@options.TASK_OPTION
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Output directory: <shard>.parquet predictions, <shard>.records.pq, summary.json.",
)
@options.split_option(options.ALL_SPLITS)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="First N records.")
@click.option(
    "--partition",
    default=None,
    metavar="I/N",
    help="Only the data shards at positions I modulo N (0 <= I < N): N independent jobs (a "
    "Slurm array, joblib) sharing the shards of one --out.",
)
@options.model_options("mode")
@SERVICE_SETTING_OPTIONS
@options.SAMPLING_OPTIONS
@options.MODEL_FILES_OPTIONS
@options.model_options("seed")
@ray_option("the job")
@RAY_RESOURCE_OPTIONS
def predict(
    meds_dir: Path,
    labels_path: Path | None,
    times: tuple[str, ...],
    task_name: str,
    out_dir: Path,
    split: str,
    limit: int | None,
    partition: str | None,
    mode: str,
    constrained: bool,
    max_input_tokens: int,
    max_new_tokens: int,
    n_samples: int,
    temperature: float | None,
    concurrency: int,
    model_dir: Path | None,
    artefact_dir: Path | None,
    export_dir: Path | None,
    kv_cache_gib: float,
    enforce_eager: bool,
    seed: int,
    ray_address: str | None,
    engines: int,
    cpu_workers: int,
    engine_cpus: float,
    engine_gpus: float,
    ray_cpus: int | None,
) -> None:
    """Score every record of a MEDS dataset into meds-evaluation predictions, shard by shard
    (resumable: shards already written are skipped)."""
    from evaluation.batch import Job, run_local
    from evaluation.runner import Sampling
    from inference.model import ModelConfig
    from medtpe_core.tasks import get_task
    from training.export import prepare_model_files

    if (labels_path is None) == (not times):
        raise click.UsageError("give either --labels FILE or --times (not both)")
    if ray_cpus is not None and ray_address != LOCAL:
        raise click.UsageError("--ray-cpus sizes a new local cluster: give --ray without ADDRESS")
    task = get_task(task_name)
    job = Job(
        meds_dir=meds_dir,
        task=task,
        labels=labels_path,
        times=tuple(_prediction_time(t) for t in times) or (None,),
        split=options.split_name(split),
        partition=_partition(partition),
        limit=limit,
        sampling=Sampling(
            n_samples=n_samples,
            temperature=options.sampling_temperature(n_samples, temperature),
            max_new_tokens=max_new_tokens,
            constrained=constrained,
        ),
        concurrency=concurrency,
    )
    config = ModelConfig.from_options(
        **options.model_files(model_dir, artefact_dir, export_dir),
        mode=mode,
        codes_dir=meds_dir,
        max_input_tokens=max_input_tokens,
        max_new_tokens=max_new_tokens,
        max_num_seqs=concurrency,
        kv_cache_gib=kv_cache_gib,
        seed=seed,
        enforce_eager=enforce_eager,
    )
    try:
        if ray_address is not None:
            check_ray_installed("--ray")  # before the model files are prepared
        prepare_model_files(config)
        if ray_address is None:
            summary = run_local(config, job, out_dir)
        else:
            from evaluation.ray_batch import RayResources, run_ray

            resources = RayResources(
                address=ray_address,
                num_cpus=ray_cpus,
                engines=engines,
                cpu_workers=cpu_workers,
                engine_cpus=engine_cpus,
                engine_gpus=engine_gpus,
            )
            summary = run_ray(config, job, out_dir, resources)
    except RayUnavailableError as exc:
        raise click.UsageError(str(exc)) from exc
    run = summary["this_run"]
    click.echo(
        f"{task.title}: {run['records']} records scored in {run['shards_written']} shards "
        f"({run['shards_skipped']} already written); {summary['records']} records in {out_dir}, "
        f"{summary['failures']} not scored, compression {summary['compression_rate']}"
    )
    click.echo(json.dumps(summary["failure_kinds"]))


commands = [predict]
