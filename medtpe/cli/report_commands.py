"""`medtpe rescore` and `medtpe compare-runs`: stored `medtpe evaluate` reports read back, no
engine."""

from __future__ import annotations

import json
from pathlib import Path

import click

from medtpe.cli.options import INPUT_FILE, one_line


@click.command("rescore")
@click.argument("report", type=INPUT_FILE)
@click.option(
    "--predictions-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Each mode's meds-evaluation predictions file goes here (<mode>.parquet).",
)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The re-scored report (JSON).",
)
def rescore(report: Path, predictions_dir: Path, out_path: Path) -> None:
    """Re-score REPORT's stored per-record results with the current metrics (F1, AUROC, AUPRC,
    Brier, ECE with patient-level bootstrap intervals, paired differences between modes) and
    add meds-evaluation's own scores of each mode's predictions file."""
    from medtpe.evaluation.stored_report import rescore_report

    try:
        rescored = rescore_report(report, predictions_dir)
    except (OSError, KeyError, ValueError) as exc:
        raise click.ClickException(f"{report}: {one_line(str(exc))}") from exc
    rescored.write(out_path)
    click.echo(f"report: {out_path}")


@click.command("compare-runs")
@click.argument("first", metavar="REPORT.json:MODE")
@click.argument("second", metavar="REPORT.json:MODE")
def compare_runs(first: str, second: str) -> None:
    """Share of records on which two evaluation runs give the same answer, and how far apart
    their probabilities of the positive answer are (same records; printed as JSON)."""
    from medtpe.evaluation.stored_report import compare_runs as compare
    from medtpe.evaluation.stored_report import mode_results

    try:
        figures = compare(mode_results(first), mode_results(second))
    except (OSError, KeyError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps({"first": first, "second": second, **figures}))


commands = [rescore, compare_runs]
