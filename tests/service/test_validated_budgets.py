"""The artefact bundle's manifest (the budgets its fidelity gate passed at) and what the service
does with it: `/readyz` reports it; a budget above it fails the start unless allowed (then it
warns); a manifest that no longer matches the artefact's files is refused."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from medtpe.core.tokenizer.artefact_manifest import (
    MANIFEST_FILE,
    ROWS_FILE,
    ArtefactBundle,
    ManifestError,
    unvalidated_budget_message,
)
from tests.support.service_support import instant_client, instant_settings

FIGURES = {"n_records": 16, "same_answer": {"value": 1.0}}


@pytest.fixture
def validated_artefact(service_files: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the test artefact whose manifest says it was validated at 512 and 1,024."""
    artefact, export = service_files
    copy = tmp_path / "artefact"
    shutil.copytree(artefact, copy)
    (copy / MANIFEST_FILE).unlink(missing_ok=True)
    ArtefactBundle.from_pretrained(copy).write_manifest({512: FIGURES, 1024: FIGURES})
    return copy, export


def test_manifest_round_trip_and_staleness(validated_artefact: tuple[Path, Path]) -> None:
    artefact, _ = validated_artefact
    bundle = ArtefactBundle.from_pretrained(artefact)
    assert bundle.validated_budgets == (512, 1024)
    assert bundle.validated[1024] == FIGURES
    manifest = json.loads((artefact / MANIFEST_FILE).read_text())
    assert manifest["artefact_id"] == bundle.artefact_id and manifest["format_version"] == 1
    assert unvalidated_budget_message(bundle, 1024) is None
    assert unvalidated_budget_message(bundle, 600) is None  # below the largest validated
    assert "validated at 512, 1024 tokens" in unvalidated_budget_message(bundle, 2048)
    rows = artefact / ROWS_FILE
    rows.write_bytes(rows.read_bytes() + b" ")  # the rows changed after the validation
    with pytest.raises(ManifestError, match="vouches for other files"):
        ArtefactBundle.from_pretrained(artefact)


def test_no_manifest_is_validated_at_no_budget(service_files: tuple[Path, Path], tmp_path):
    copy = tmp_path / "artefact"
    shutil.copytree(service_files[0], copy)
    (copy / MANIFEST_FILE).unlink(missing_ok=True)
    bundle = ArtefactBundle.from_pretrained(copy)
    assert bundle.validated_budgets == ()
    assert "at no budget (no manifest)" in unvalidated_budget_message(bundle, 512)


def test_readyz_reports_the_validated_budgets(validated_artefact: tuple[Path, Path]) -> None:
    settings = instant_settings(validated_artefact, max_input_tokens=1024)
    with instant_client(settings) as client:
        ready = client.get("/readyz").json()
    assert ready["validated_budgets"] == [512, 1024] and ready["max_input_tokens"] == 1024


def test_a_budget_above_the_validated_ones_fails_the_start(
    validated_artefact: tuple[Path, Path],
) -> None:
    settings = instant_settings(
        validated_artefact, max_input_tokens=2048, allow_unvalidated_budget=False
    )
    with pytest.raises(RuntimeError) as failed, instant_client(settings):
        pass
    readiness = str(failed.value)
    assert "'status': 'failed'" in readiness
    assert "validated at 512, 1024 tokens; this service's input budget is 2048" in readiness
    assert "MEDTPE_MAX_INPUT_TOKENS" in readiness and "MEDTPE_ALLOW_UNVALIDATED_BUDGET" in readiness


def test_allowing_an_unvalidated_budget_warns(
    validated_artefact: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    settings = instant_settings(
        validated_artefact, max_input_tokens=2048, allow_unvalidated_budget=True
    )
    with caplog.at_level(logging.WARNING, "medtpe.service"), instant_client(settings) as client:
        assert client.get("/readyz").json()["validated_budgets"] == [512, 1024]
    assert any(
        "serving it anyway" in r.message and "budget is 2048" in r.message for r in caplog.records
    )


def test_original_mode_does_not_need_a_validation(validated_artefact: tuple[Path, Path]) -> None:
    settings = instant_settings(
        validated_artefact, max_input_tokens=2048, mode="original", allow_unvalidated_budget=False
    )
    with instant_client(settings) as client:
        assert client.get("/readyz").json()["status"] == "ready"
