"""`medtpe outcomes` and `medtpe monitor`: what happened after the ledger's predictions, and the
monitoring report (`monitoring`). Both read the ledger `MEDTPE_LEDGER_URL` names, or `--ledger`.

`medtpe outcomes` labels each prediction of a task by the task's own labeller from a MEDS dataset
(`--meds`) or a FHIR Bulk export (`--fhir`, read through the site mapping as `medtpe predict
--fhir` reads it), at the task's horizon, and records each prediction's cohort attributes; run
it again as data arrive (nightly): open outcomes close, nothing is duplicated.

`medtpe monitor` writes `report.html`, `report.json` and `seismometer/<task>/` under `--out`,
reading the period's rows streamed (a period past `medtpe.monitoring.frame.MAX_REPORT_ROWS`
predictions is refused, to be reported in parts). The report's modules (matplotlib: the
`monitor` extra) are imported inside the commands.

Every wait of either command on the ledger is a connect or a statement, each bounded by the
ledger's timeouts (`MEDTPE_LEDGER_STATEMENT_TIMEOUT_S`, `MEDTPE_LEDGER_LOCK_TIMEOUT_S`): a table
locked past them stops the command with the database's reason, never a wait without end."""

from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from medtpe.cli.ledger_commands import LEDGER_OPTION, existing_ledger, ledger_settings
from medtpe.cli.options import (
    FHIR_MAPPING_OPTION,
    INPUT_FILE,
    TASK_OPTION,
    fhir_dirs_option,
    meds_dir_option,
)
from medtpe.core.meds.readers import MedsDataset, MedsFormatError
from medtpe.core.tasks import get_task
from medtpe.core.thresholds import Thresholds, ThresholdsError
from medtpe.monitoring.cohort import AttributeMapError, load_attribute_map
from medtpe.monitoring.figures import DEFAULT_RESAMPLES

if TYPE_CHECKING:  # the store (SQLAlchemy: the `service` or `monitor` extra) inside the commands
    from medtpe.ledger.store import Ledger
    from medtpe.monitoring.outcomes import SubjectSource

MAX_RESAMPLES = 10_000


def _fhir_source(
    ledger: Ledger, task: str, dirs: tuple[Path, ...], mapping_path: Path | None
) -> SubjectSource:
    """The records of the export's patients the ledger predicted for (the export grouped by
    patient as `medtpe predict --fhir` groups it, in a temporary directory)."""
    from medtpe.batch.fhir_export import ExportError
    from medtpe.batch.fhir_job import FhirInput, partitioned
    from medtpe.core.fhir import SiteMappingError, load_site_mapping
    from medtpe.monitoring.outcomes import RecordsSource, fhir_records, subjects_of

    try:
        mapping = load_site_mapping(mapping_path)
    except SiteMappingError as exc:
        raise click.ClickException(str(exc)) from exc
    wanted = subjects_of(ledger, task)
    with tempfile.TemporaryDirectory(prefix="medtpe-outcomes-") as work:
        try:
            partition, _ = partitioned(
                FhirInput(dirs, mapping_path), Path(work), reuse=False, progress=False
            )
        except ExportError as exc:
            raise click.ClickException(str(exc)) from exc
        subjects = partition.subjects()
        patients = (
            (patient, resources.texts)
            for bucket in range(partition.n_buckets)
            for patient, resources in partition.patients_of(bucket)
        )
        records, refused = fhir_records(patients, mapping, subjects, wanted)
    if refused:
        click.echo(f"{refused} patient(s) the FHIR mapping refused: left without outcome", err=True)
    return RecordsSource.of("fhir:" + ",".join(str(d) for d in dirs), records)


@click.command("outcomes")
@LEDGER_OPTION
@TASK_OPTION
@meds_dir_option(
    "A MEDS dataset holding what happened (the subjects' events after the predictions).",
    required=False,
)
@fhir_dirs_option(
    "A FHIR Bulk Data export directory instead (repeat for increments, oldest first)."
)
@FHIR_MAPPING_OPTION
@click.option(
    "--attributes",
    "attributes_path",
    type=INPUT_FILE,
    default=None,
    help="YAML of cohort attributes mapped from codes ({attribute: {code: value}}; a code "
    "ending in * matches a prefix); sex and age band are always recorded.",
)
def outcomes(
    ledger_url: str | None,
    task_name: str,
    meds_dir: Path | None,
    fhir_dirs: tuple[Path, ...],
    fhir_mapping: Path | None,
    attributes_path: Path | None,
) -> None:
    """Label the ledger's predictions of a task whose outcome is not known yet with what happened
    (the task's labeller, at its horizon; not yet known: open, counted) and record their cohort
    attributes, 500 a transaction. Idempotent."""
    from medtpe.ledger.store import LedgerUnavailable
    from medtpe.monitoring.outcomes import MedsSource, join_outcomes

    if (meds_dir is None) == (not fhir_dirs):
        raise click.UsageError("give either --meds or --fhir")
    task = get_task(task_name)
    try:
        mapping = load_attribute_map(attributes_path)
    except AttributeMapError as exc:
        raise click.BadParameter(str(exc), param_hint="--attributes") from exc
    ledger = existing_ledger(ledger_settings(ledger_url))
    try:
        if meds_dir is not None:
            try:
                source = MedsSource(MedsDataset.load(meds_dir), f"meds:{meds_dir}")
            except MedsFormatError as exc:
                raise click.ClickException(str(exc)) from exc
        try:
            if meds_dir is None:
                source = _fhir_source(ledger, task.name, fhir_dirs, fhir_mapping)
            counts = join_outcomes(ledger, task, source, mapping)
        except LedgerUnavailable as exc:
            raise click.ClickException(str(exc)) from exc
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--task") from exc
    finally:
        ledger.close()
    data_end = source.data_end.isoformat() if source.data_end else None
    click.echo(json.dumps({"task": task.name, "data_end": data_end, **counts.as_dict()}))


def _utc(when: datetime | None) -> datetime | None:
    return None if when is None else when.replace(tzinfo=UTC)


@click.command("monitor")
@LEDGER_OPTION
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where report.html, report.json and seismometer/ are written.",
)
@click.option(
    "--since",
    type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S"]),
    default=None,
    help="Only predictions made at or after this UTC date/time.",
)
@click.option(
    "--until",
    type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S"]),
    default=None,
    help="Only predictions made before this UTC date/time.",
)
@click.option(
    "--thresholds",
    "thresholds_path",
    type=INPUT_FILE,
    default=None,
    help="YAML of operating thresholds on p(yes) per task and site [default: 0.5].",
)
@click.option(
    "--resamples",
    type=click.IntRange(10, MAX_RESAMPLES),
    default=DEFAULT_RESAMPLES,
    show_default=True,
    help="Patient-level bootstrap resamples per figure.",
)
def monitor(
    ledger_url: str | None,
    out_dir: Path,
    since: datetime | None,
    until: datetime | None,
    thresholds_path: Path | None,
    resamples: int,
) -> None:
    """The monitoring report of the ledger's predictions: per task, week, site and subgroup;
    silent and shadow predictions apart; HTML, JSON and a seismometer export."""
    from medtpe.ledger.store import LedgerUnavailable
    from medtpe.monitoring.frame import PeriodTooLarge
    from medtpe.monitoring.report import REPORT_HTML, ReportSettings, write_report

    if since is not None and until is not None and until <= since:
        raise click.BadParameter("must be after --since", param_hint="--until")
    try:
        thresholds = Thresholds.load(thresholds_path)
    except ThresholdsError as exc:
        raise click.BadParameter(str(exc), param_hint="--thresholds") from exc
    ledger = existing_ledger(ledger_settings(ledger_url))
    settings = ReportSettings(_utc(since), _utc(until), thresholds, resamples)
    try:
        report = write_report(ledger.engine, out_dir, settings)
    except LedgerUnavailable as exc:
        raise click.ClickException(str(exc)) from exc
    except PeriodTooLarge as exc:
        raise click.BadParameter(str(exc), param_hint="--since/--until") from exc
    finally:
        ledger.close()
    for task in report["tasks"]:
        click.echo(f"{task['task']}: {task['overall']['n']} live predictions. {task['verdict']}")
    click.echo(f"report: {out_dir / REPORT_HTML}")


commands = [outcomes, monitor]
