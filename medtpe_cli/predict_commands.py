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

from medtpe_cli.meds_commands import ALL_SPLITS, SPLITS
from medtpe_core.paths import default_artefact_dir, default_export_dir, default_model_dir

LAST_EVENT = "last"
"""`--times` value: one minute after each subject's last event (the service's default)."""
LOCAL_RAY = "local"
"""`--ray` without an address: a Ray cluster started on this machine for the job."""


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


@click.command("predict")
@click.option("--meds", "meds_dir", required=True, type=click.Path(exists=True, path_type=Path))
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
@click.option(
    "--task",
    "task_name",
    required=True,
    envvar="MEDTPE_TASK",
    help="Task name (e.g. icu_mortality); default: $MEDTPE_TASK (MEDS-DEV's model.yaml uses it).",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Output directory: <shard>.parquet predictions, <shard>.records.pq, summary.json.",
)
@click.option(
    "--split",
    type=click.Choice(SPLITS),
    default=ALL_SPLITS,
    show_default=True,
    help="Only the subjects of this split of metadata/subject_splits.parquet (ignored when the "
    "dataset has none).",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="First N records.")
@click.option(
    "--partition",
    default=None,
    metavar="I/N",
    help="Only the data shards at positions I modulo N (0 <= I < N): N independent jobs (a "
    "Slurm array, joblib) sharing the shards of one --out.",
)
@click.option(
    "--mode", type=click.Choice(["medtpe", "original"]), default="medtpe", show_default=True
)
@click.option(
    "--constrained/--free",
    default=False,
    show_default=True,
    help="Constrain decoding to well-formed answers (vLLM structured outputs).",
)
@click.option(
    "--max-input-tokens",
    type=click.IntRange(min=1),
    default=8192,
    show_default=True,
    envvar="MEDTPE_MAX_INPUT_TOKENS",
    show_envvar=True,
    help="Input budget in ORIGINAL tokenizer tokens (the service's default); shrunk to the "
    "model's context minus --max-new-tokens.",
)
@click.option(
    "--max-new-tokens",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    envvar="MEDTPE_MAX_NEW_TOKENS",
    show_envvar=True,
)
@click.option("--n-samples", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0.0),
    default=None,
    help="Sampling temperature [default: 0 for one sample, 0.7 for majority voting].",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    envvar="MEDTPE_MAX_CONCURRENCY",
    show_envvar=True,
    help="Records in flight to one engine (the service's default).",
)
@click.option("--model", "model_dir", type=click.Path(path_type=Path), default=None)
@click.option("--artefact", "artefact_dir", type=click.Path(path_type=Path), default=None)
@click.option(
    "--export-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Exported MedTPE checkpoint (written from --model and --artefact when missing or stale).",
)
@click.option(
    "--kv-cache-gib",
    type=click.FloatRange(min=0.1),
    default=4.0,
    show_default=True,
    envvar="MEDTPE_KV_CACHE_GIB",
    show_envvar=True,
)
@click.option(
    "--enforce-eager/--compile",
    default=False,
    show_default=True,
    envvar="MEDTPE_ENFORCE_EAGER",
    show_envvar=True,
    help="Skip torch.compile: the engine starts sooner, decodes slower.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value=LOCAL_RAY,
    default=None,
    help="Run on Ray Data: on the cluster at ADDRESS, or (--ray alone) a local one.",
)
@click.option(
    "--engines",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="With --ray: generation actors, each holding one engine.",
)
@click.option(
    "--cpu-workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="With --ray: CPU actors reading shards, rendering and MedTPE-encoding records.",
)
@click.option(
    "--engine-cpus",
    type=click.FloatRange(min=0.0),
    default=1.0,
    show_default=True,
    help="With --ray: CPUs Ray reserves for each generation actor.",
)
@click.option(
    "--engine-gpus",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="With --ray: GPUs Ray reserves for each generation actor (1 on a GPU cluster).",
)
@click.option(
    "--ray-cpus",
    type=click.IntRange(min=1),
    default=None,
    help="With --ray alone: CPUs of the local cluster [default: this machine's].",
)
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
    from inference.engine import EngineOptions
    from inference.model import ModelConfig
    from medtpe_core.meds_readers import read_subject_splits
    from medtpe_core.tasks import get_task
    from training.export import prepare_model_files

    if (labels_path is None) == (not times):
        raise click.UsageError("give either --labels FILE or --times (not both)")
    task = get_task(task_name)
    has_splits = bool(read_subject_splits(meds_dir))
    job = Job(
        meds_dir=meds_dir,
        task=task,
        labels=labels_path,
        times=tuple(_prediction_time(t) for t in times) or (None,),
        split=split if has_splits and split != ALL_SPLITS else None,
        partition=_partition(partition),
        limit=limit,
        sampling=Sampling(
            n_samples=n_samples,
            temperature=temperature
            if temperature is not None
            else (0.0 if n_samples == 1 else 0.7),
            max_new_tokens=max_new_tokens,
            constrained=constrained,
        ),
        concurrency=concurrency,
    )
    config = ModelConfig(
        model_dir=model_dir or default_model_dir(),
        artefact_dir=artefact_dir or default_artefact_dir(),
        export_dir=export_dir or default_export_dir(),
        mode=mode,
        codes_dir=meds_dir,
        max_input_tokens=max_input_tokens,
        max_new_tokens=max_new_tokens,
        engine=EngineOptions(
            max_num_seqs=concurrency,
            kv_cache_gib=kv_cache_gib,
            seed=seed,
            enforce_eager=enforce_eager,
        ),
    )
    prepare_model_files(config)
    if ray_address is None:
        summary = run_local(config, job, out_dir)
    else:
        from evaluation.ray_batch import RayResources, run_ray

        resources = RayResources(
            address=None if ray_address == LOCAL_RAY else ray_address,
            num_cpus=ray_cpus,
            engines=engines,
            cpu_workers=cpu_workers,
            engine_cpus=engine_cpus,
            engine_gpus=engine_gpus,
        )
        summary = run_ray(config, job, out_dir, resources)
    run = summary["this_run"]
    click.echo(
        f"{task.title}: {run['records']} records scored in {run['shards_written']} shards "
        f"({run['shards_skipped']} already written); {summary['records']} records in {out_dir}, "
        f"{summary['failures']} not scored, compression {summary['compression_rate']}"
    )
    click.echo(json.dumps(summary["failure_kinds"]))


commands = [predict]
