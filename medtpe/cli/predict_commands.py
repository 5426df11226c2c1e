"""`medtpe predict`: the batch job scoring a whole MEDS dataset into meds-evaluation predictions,
in this process (`medtpe.batch.job`) or on a Ray cluster (`--ray`, `medtpe.batch.ray_job`).

The model settings default to the service's and read the same `MEDTPE_*` variables (budget, answer
length, KV cache, concurrency, eager engine), so a MEDS-DEV run, which passes only directories,
is configured from its environment.

The engine (vLLM, torch) and Ray are imported inside the command, so loading the CLI stays light.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from medtpe.batch.defaults import DEFAULT_BUCKET_MIB, DEFAULT_SCOPE
from medtpe.cli import options
from medtpe.cli.ledger_commands import ledger_settings
from medtpe.cli.ray_option import ray_option
from medtpe.core.ray_cluster import LOCAL, RayUnavailableError, check_ray_installed
from medtpe.core.tasks import Task, get_task

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


def parse_partition(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    index, _, count = value.partition("/")
    numbers = index.isascii() and count.isascii() and index.isdigit() and count.isdigit()
    if not (numbers and len(index) <= 9 and len(count) <= 9 and int(index) < int(count)):
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
"""The Ray job's resources (`medtpe.batch.ray_job.RayResources`)."""


SERVICE_SETTING_OPTIONS = options.model_options(
    "max_input_tokens",
    "prompt_layout",
    "max_new_tokens",
    "max_num_seqs",
    "kv_cache_gib",
    "enforce_eager",
    "dtype",
    env=True,
    max_num_seqs="Records in flight to one engine (also its `max_num_seqs`).",
)
"""The model and engine options the service reads from the same `MEDTPE_*` variables, with
their declared defaults."""


def _with_server(text: str) -> str:
    return f"With --fhir-server: {text}"


FHIR_OPTIONS = options.together(
    options.fhir_dirs_option(
        "In place of --meds: a FHIR Bulk Data export directory (*.ndjson, *.ndjson.gz, its "
        "manifest.json), read through the site's FHIR mapping as /predict reads a Bundle. Repeat "
        "to read a base export then its _since increments (a later resource replaces its "
        "earlier line); with --fhir-server, read before the new export."
    ),
    click.option(
        "--fhir-server",
        type=options.HTTP_URL,
        default=None,
        help="Export the records from this FHIR server first (Bulk Data $export, SMART Backend "
        "Services), into <out>/export (resumed by a second run), then read them as --fhir.",
    ),
    click.option(
        "--export-level",
        type=click.Choice(["patient", "system"]),
        default="patient",
        show_default=True,
        help=_with_server("Patient/$export (every patient) or $export (the whole server)."),
    ),
    click.option(
        "--group", "group_id", default=None, help=_with_server("only Group/ID's patients.")
    ),
    click.option(
        "--type",
        "export_types",
        multiple=True,
        help=_with_server("_type, repeated [default: the types the FHIR mapping reads]."),
    ),
    click.option(
        "--since",
        default=None,
        metavar="INSTANT",
        help=_with_server(
            "_since: only resources changed since (a nightly increment: give the "
            "base export as --fhir)."
        ),
    ),
    click.option(
        "--client-id",
        envvar="MEDTPE_FHIR_CLIENT_ID",
        show_envvar=True,
        default=None,
        help=_with_server("the SMART Backend Services client id the EHR registered."),
    ),
    click.option(
        "--client-key",
        type=options.INPUT_FILE,
        envvar="MEDTPE_FHIR_CLIENT_KEY_FILE",
        show_envvar=True,
        default=None,
        help=_with_server(
            "the client's private key, PEM (RSA: RS384, P-384: ES384); or its "
            "PEM text in $MEDTPE_FHIR_CLIENT_KEY."
        ),
    ),
    click.option(
        "--client-kid",
        envvar="MEDTPE_FHIR_CLIENT_KID",
        show_envvar=True,
        default=None,
        help=_with_server("the key's id at the EHR [default: its RFC 7638 thumbprint]."),
    ),
    click.option(
        "--scope",
        envvar="MEDTPE_FHIR_SCOPE",
        show_envvar=True,
        default=DEFAULT_SCOPE,
        show_default=True,
        help=_with_server("the scopes asked for."),
    ),
    options.FHIR_MAPPING_OPTION,
    click.option(
        "--codes",
        "codes_dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        envvar="MEDTPE_CODES_DIR",
        show_envvar=True,
        default=None,
        help="With FHIR input: a MEDS dataset whose metadata/codes.parquet describes the codes "
        "the artefact's own table does not (with --meds: that dataset's table).",
    ),
    click.option(
        "--codes-replace",
        "codes_replace",
        is_flag=True,
        envvar="MEDTPE_CODES_REPLACE",
        show_envvar=True,
        help=options.ModelConfig.declared("codes_replace").help
        + " With --meds: that dataset's table replaces the artefact's.",
    ),
    click.option(
        "--write-back",
        is_flag=True,
        help=_with_server(
            "write each answer back to that server: a FHIR RiskAssessment with its Provenance "
            "per prediction, in transaction Bundles, with a token of the write scopes "
            "(conditional creates on the prediction id: a rerun writes nothing twice)."
        ),
    ),
    click.option(
        "--model-card-url",
        type=options.HTTP_URL,
        default=None,
        help="With --write-back: where the model card is published (the service's "
        "<MEDTPE_CDS_BASE_URL>/model-card.xml), named by the card written.",
    ),
    click.option(
        "--bucket-mib",
        type=click.IntRange(min=1),
        default=DEFAULT_BUCKET_MIB,
        show_default=True,
        help="With FHIR input: resources per bucket of the grouping by patient (its memory).",
    ),
)
"""The FHIR input of `medtpe predict` (`medtpe.batch.fhir_job`, `medtpe.batch.bulk_client`)."""


def _server_access(fhir: dict[str, Any]) -> Any:
    """The `medtpe.batch.bulk_client.ServerAccess` of `--fhir-server` and its client options."""
    from medtpe.batch.bulk_client import ServerAccess

    return ServerAccess(
        fhir["fhir_server"],
        fhir["client_id"],
        fhir["client_key"],
        fhir["client_kid"],
        fhir["scope"],
    )


def fhir_source(fhir: dict[str, Any], out_dir: Path) -> Any:
    """The `medtpe.batch.fhir_job.FhirInput` of the FHIR options (None: none given), the export from
    `--fhir-server` made first."""
    if not fhir["fhir_dirs"] and fhir["fhir_server"] is None:
        return None
    from medtpe.batch.bulk_client import ExportRequest, export_from_server
    from medtpe.batch.fhir_http import FhirServerError
    from medtpe.batch.fhir_job import FhirInput

    directories = tuple(fhir["fhir_dirs"])
    if fhir["fhir_server"] is not None:
        access = _server_access(fhir)
        request = ExportRequest(
            level="group" if fhir["group_id"] else fhir["export_level"],
            group=fhir["group_id"],
            since=fhir["since"],
            **({"types": tuple(fhir["export_types"])} if fhir["export_types"] else {}),
        )
        try:
            result = export_from_server(access, request, Path(out_dir) / "export")
        except (FhirServerError, ValueError) as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(
            f"export: {result.files} files ({result.transaction_time}), "
            f"{result.bytes_downloaded} bytes downloaded in {result.seconds:.0f} s"
        )
        directories += (Path(result.directory),)
    return FhirInput(directories, fhir["fhir_mapping"], fhir["bucket_mib"])


@click.command("predict")
@options.meds_dir_option(
    "MEDS dataset directory (data/, metadata/); or give --fhir / --fhir-server.", required=False
)
@FHIR_OPTIONS
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
@options.TASKS_OPTION
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Output directory: <shard>.parquet predictions, <shard>.records.pq (with several "
    "tasks, in <task>/), summary.json.",
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
    task_names: tuple[str, ...],
    out_dir: Path,
    split: str,
    limit: int | None,
    partition: str | None,
    mode: str,
    constrained: bool,
    max_input_tokens: int,
    prompt_layout: str,
    max_new_tokens: int,
    n_samples: int,
    temperature: float | None,
    concurrency: int,
    model_dir: Path | None,
    artefact_dir: Path | None,
    export_dir: Path | None,
    kv_cache_gib: float,
    enforce_eager: bool,
    dtype: str,
    seed: int,
    ray_address: str | None,
    engines: int,
    cpu_workers: int,
    engine_cpus: float,
    engine_gpus: float,
    ray_cpus: int | None,
    **fhir: Any,
) -> None:
    """Score every record of a MEDS dataset or a FHIR Bulk Data export into meds-evaluation
    predictions, shard by shard (resumable: shards already written are skipped); with several
    tasks, each record is read and rendered once and asked each of them."""
    from medtpe.batch.job import Job
    from medtpe.inference.model import ModelConfig

    ledger = _check_inputs(
        labels_path, times, meds_dir, split, partition, ray_address, ray_cpus, fhir
    )
    task, *more_tasks = _tasks(task_names, labels_path)
    job = Job(
        meds_dir=meds_dir,
        task=task,
        more_tasks=tuple(more_tasks),
        labels=labels_path,
        times=tuple(_prediction_time(t) for t in times) or (None,),
        split=options.split_name(split),
        partition=parse_partition(partition),
        limit=limit,
        sampling=options.sampling(n_samples, temperature, max_new_tokens, constrained),
        concurrency=concurrency,
    )
    config = ModelConfig.from_options(
        **options.model_files(model_dir, artefact_dir, export_dir),
        mode=mode,
        codes_dir=meds_dir or fhir["codes_dir"],
        codes_replace=fhir["codes_replace"],
        max_input_tokens=max_input_tokens,
        prompt_layout=prompt_layout,
        max_new_tokens=max_new_tokens,
        max_num_seqs=concurrency,
        kv_cache_gib=kv_cache_gib,
        seed=seed,
        enforce_eager=enforce_eager,
        dtype=dtype,
    )
    ray = {
        "num_cpus": ray_cpus,
        "engines": engines,
        "cpu_workers": cpu_workers,
        "engine_cpus": engine_cpus,
        "engine_gpus": engine_gpus,
    }
    summary, source = _run_job(config, job, fhir, out_dir, ray_address, ray, ledger)
    _echo_summary(job.tasks, summary, out_dir)
    if fhir["write_back"]:
        _write_back(fhir, config, job, source, out_dir, summary["this_run"], ledger)


def _tasks(task_names: tuple[str, ...], labels_path: Path | None) -> list[Task]:
    """The tasks `--task` names; a usage error for several with a label file (it labels one)."""
    if labels_path is not None and len(task_names) > 1:
        raise click.UsageError("a label file labels one task: with several --task, give --times")
    return [get_task(name) for name in task_names]


def _check_inputs(
    labels_path: Path | None,
    times: tuple[str, ...],
    meds_dir: Path | None,
    split: str,
    partition: str | None,
    ray_address: str | None,
    ray_cpus: int | None,
    fhir: dict[str, Any],
) -> Any:
    """A usage error for options of `medtpe predict` that exclude or need each other; the
    ledger's settings (`medtpe.ledger.settings.LedgerSettings`, read once: a variable the ledger
    refuses stops the run here, and the job and the write-back take these)."""
    if (labels_path is None) == (not times):
        raise click.UsageError("give either --labels FILE or --times (not both)")
    if ray_cpus is not None and ray_address != LOCAL:
        raise click.UsageError("--ray-cpus sizes a new local cluster: give --ray without ADDRESS")
    with_fhir = bool(fhir["fhir_dirs"]) or fhir["fhir_server"] is not None
    if (meds_dir is None) != with_fhir:
        raise click.UsageError("give either --meds DIR or --fhir DIR / --fhir-server URL")
    if with_fhir and (split != options.ALL_SPLITS or partition is not None):
        raise click.UsageError("--split and --partition read MEDS shards: not with FHIR input")
    if fhir["write_back"] and fhir["fhir_server"] is None:
        raise click.UsageError("--write-back writes to the server of --fhir-server: give both")
    if fhir["model_card_url"] is not None and not fhir["write_back"]:
        raise click.UsageError("--model-card-url names the card --write-back writes: give both")
    ledger = ledger_settings(None)
    if fhir["write_back"] and ledger.ledger_off:
        raise click.UsageError(
            "--write-back writes the answers the ledger holds: not with MEDTPE_LEDGER_OFF=true"
        )
    return ledger


def _run_job(
    config: Any,
    job: Any,
    fhir: dict[str, Any],
    out_dir: Path,
    ray_address: str | None,
    ray: dict[str, Any],
    ledger: Any,
) -> tuple[dict[str, Any], Any]:
    """Prepare the model files and run `job` on its input (MEDS or FHIR, exported from
    `--fhir-server` first; its answers recorded in `ledger`, the `LedgerSettings`), in this
    process or on Ray (`ray`: `RayResources`' other fields);
    its summary and its FHIR input (None: MEDS). A ledger that cannot be opened or written
    (down, or a table locked past `MEDTPE_LEDGER_LOCK_TIMEOUT_S`: every wait on it is a
    statement the ledger's timeouts bound) stops the job with its reason; the shards committed
    before stay, and a run again goes on from there."""
    from medtpe.batch.job import run_local
    from medtpe.ledger.store import LedgerUnavailable
    from medtpe.training.export import prepare_model_files

    try:
        if ray_address is not None:
            check_ray_installed("--ray")  # before the model files are prepared
        prepare_model_files(config)
        resources = None
        if ray_address is not None:
            from medtpe.batch.ray_job import RayResources

            resources = RayResources(address=ray_address, **ray)
        source = fhir_source(fhir, out_dir)
        if source is not None:
            from medtpe.batch.fhir_export import ExportError
            from medtpe.batch.fhir_job import ExportChangedError, run_fhir
            from medtpe.core.fhir import SiteMappingError

            try:
                summary = run_fhir(config, job, source, out_dir, ray=resources, ledger=ledger)
            except (ExportError, ExportChangedError, SiteMappingError) as exc:
                raise click.ClickException(str(exc)) from exc
        elif resources is None:
            summary = run_local(config, job, out_dir, ledger=ledger)
        else:
            from medtpe.batch.ray_job import run_ray

            summary = run_ray(config, job, out_dir, resources, ledger=ledger)
    except RayUnavailableError as exc:
        raise click.UsageError(str(exc)) from exc
    except LedgerUnavailable as exc:
        raise click.ClickException(str(exc)) from exc
    return summary, source


def _echo_summary(tasks: Sequence[Any], summary: dict[str, Any], out_dir: Path) -> None:
    """Print what the job scored, what it could not (per task), what the engine's prefix cache
    spared, and what the FHIR export held."""
    from medtpe.batch.job import PrefixReuse

    run = summary["this_run"]
    per_task = summary.get("tasks", {tasks[0].name: summary})
    for task in tasks:
        figures = per_task[task.name]
        where = out_dir if len(tasks) == 1 else Path(out_dir) / task.name
        click.echo(
            f"{task.title}: {run['records']} records scored in {run['shards_written']} shards "
            f"({run['shards_skipped']} already written); {figures['records']} records in "
            f"{where}, {figures['failures']} not scored, compression "
            f"{figures['compression_rate']}"
        )
        click.echo(json.dumps(figures["failure_kinds"]))
    click.echo(PrefixReuse.of(run["prefix_cache"]).line())
    export = run.get("fhir_export")
    if export:
        click.echo(
            f"FHIR: {export['lines']} lines, {export['patients']} patients, "
            f"{sum(export['issues'].values())} lines left out ({out_dir}/fhir_issues.ndjson)"
        )


def _write_back(
    fhir: dict[str, Any],
    config: Any,
    job: Any,
    source: Any,
    out_dir: Path,
    run: dict[str, Any],
    ledger: Any,
) -> None:
    """Write the job's answers back to `--fhir-server` (`medtpe.batch.write_back`), each identified
    by its row in the ledger of `ledger` (the job's `LedgerSettings`), and report what the server
    created and already had."""
    from medtpe.batch.fhir_http import FhirServerError
    from medtpe.batch.write_back import WRITE_BACK_SCOPE, fhir_job_items, job_model, write_back
    from medtpe.ledger.store import LedgerUnavailable

    model = job_model(config.artefact_dir, run, fhir["model_card_url"])
    access = replace(_server_access(fhir), scope=WRITE_BACK_SCOPE)
    try:
        opened = ledger.open_ledger()
        try:
            result = write_back(access, fhir_job_items(source, job, out_dir, opened), model)
        finally:
            opened.close()
    except (FhirServerError, LedgerUnavailable, ValueError) as exc:
        raise click.ClickException(f"write-back: {exc}") from exc
    created, existing = result.created, result.existing
    click.echo(
        f"write-back: {result.predictions} predictions in {result.bundles} transactions to "
        f"{access.base_url}: {created['RiskAssessment']} RiskAssessments and "
        f"{created['Provenance']} Provenances created, {existing['RiskAssessment']} "
        f"RiskAssessments already there"
    )


commands = [predict]
