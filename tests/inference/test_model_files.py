"""The service only loads model files prepared offline: a missing base checkpoint, or a missing or
stale export, fails the start (`/readyz` `failed`) with an error naming the command that writes
it (in-process app on the instant engine); the training layer's `ensure_export` writes the
export, stamps it with the artefact's digest, and leaves a current one alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from medtpe.core.paths import default_model_dir
from medtpe.core.tokenizer.artefact_manifest import content_digest
from medtpe.inference.checkpoints import EXPORT_STAMP, ModelFilesMissing, check_export
from medtpe.service.settings import ServiceSettings
from tests.support.service_support import build_test_artefact, instant_client, instant_settings

pytestmark = [pytest.mark.timeout(600)]


def failed_start(settings: ServiceSettings) -> str:
    """The readiness body of an in-process start that failed."""
    with pytest.raises(RuntimeError) as failed, instant_client(settings):
        pass
    readiness = str(failed.value)
    assert "'status': 'failed'" in readiness
    assert "ModelFilesMissing" in readiness
    return readiness


def test_a_missing_export_fails_the_start_naming_medtpe_export(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    artefact, _ = service_files
    export = tmp_path / "export"
    readiness = failed_start(instant_settings(service_files, export_dir=export))
    assert f"no exported checkpoint at {export}" in readiness
    command = f"medtpe export --base {default_model_dir()} --medtpe {artefact} --out {export}"
    assert command in readiness
    assert not export.exists()  # the service wrote nothing


def test_a_stale_export_fails_the_start_naming_medtpe_export(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    artefact, _ = service_files
    export = tmp_path / "export"
    export.mkdir()
    (export / EXPORT_STAMP).write_text("0" * 64 + "\n")  # exported from another artefact
    readiness = failed_start(instant_settings(service_files, export_dir=export))
    assert f"the exported checkpoint at {export} is stale" in readiness
    assert f"medtpe export --base {default_model_dir()} --medtpe {artefact} --out {export}" in (
        readiness
    )


def test_a_missing_base_checkpoint_fails_the_start_naming_prepare_model(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    base = tmp_path / "no-model"
    settings = instant_settings(service_files, model_dir=base, mode="original")
    readiness = failed_start(settings)
    assert f"no base checkpoint at {base} (no config.json)" in readiness
    assert f"medtpe prepare-model --out {base}" in readiness


def test_ensure_export_stamps_skips_a_current_export_and_redoes_a_stale_one(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    from medtpe.training.embedding_init import NewRows
    from medtpe.training.export import ensure_export, load_rows, save_rows
    from tests.support.model_fixtures import tiny_llama

    base = tiny_llama(tmp_path / "base")
    artefact = build_test_artefact(base, tmp_path / "artefact", budget=40)
    export = tmp_path / "export"
    with pytest.raises(ModelFilesMissing, match="no exported checkpoint"):
        check_export(base, artefact, export)

    assert ensure_export(base, artefact, export) == export
    assert (export / EXPORT_STAMP).read_text().strip() == content_digest(artefact)
    assert check_export(base, artefact, export) == export
    weights = export / "model.safetensors"
    written = weights.stat().st_mtime_ns
    ensure_export(base, artefact, export)
    assert weights.stat().st_mtime_ns == written  # current: left as it is

    rows, fingerprint = load_rows(artefact)
    save_rows(artefact, NewRows(rows.input * 2, rows.output), fingerprint)  # retrained rows
    with pytest.raises(ModelFilesMissing, match="is stale"):
        check_export(base, artefact, export)
    ensure_export(base, artefact, export)
    assert check_export(base, artefact, export) == export
