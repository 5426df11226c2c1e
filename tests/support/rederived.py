"""A ledger row re-derived as `medtpe verify` does it (`medtpe.cli.ledger_commands.rederive`), on
the instant engine."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from medtpe.cli.ledger_commands import RecordSource, rederive
from medtpe.inference.engines.instant import InstantEngine
from medtpe.ledger.receipt import Receipt
from medtpe.ledger.store import PredictionRow
from medtpe.ledger.verification import Check, compare


def service_model_files(service_files: tuple[Path, Path]) -> dict[str, Any]:
    """The test service's model files (`service_files`: artefact and export) as `rederive`
    takes them."""
    artefact, export = service_files
    return {"artefact_dir": artefact, "export_dir": export, "codes_dir": None}


def rederived_checks(
    row: PredictionRow, source: RecordSource, files: dict[str, Any], **receipt_changes: Any
) -> dict[str, Check]:
    """`medtpe verify`'s checks, by part, of `row` re-derived from `source` with the model
    `files` on the instant engine; `receipt_changes` alter its receipt first."""
    receipt = dataclasses.replace(Receipt.from_text(row.receipt), **receipt_changes)
    again = rederive(row, receipt, source, files, InstantEngine.factory())
    return {check.part: check for check in compare(receipt, again)}
