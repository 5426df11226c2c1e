"""`record_rendering`: an artefact built before builds shipped their code descriptions gets them
(and the renderer's version) afterwards, its merges, rows, id and validation untouched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from medtpe.core.meds.readers import read_code_descriptions
from medtpe.core.paths import default_artefact_dir
from medtpe.core.tokenizer.artefact_manifest import (
    DESCRIPTIONS_FILE,
    MANIFEST_FILE,
    ArtefactBundle,
    Rendering,
)
from medtpe.training.build_artefact import record_rendering
from tests.support.mimic_fhir_fixture import FIXTURE


def test_an_earlier_artefact_gets_its_rendering_and_keeps_its_identity(tmp_path: Path) -> None:
    artefact = tmp_path / "artefact"
    shutil.copytree(default_artefact_dir(), artefact, ignore=shutil.ignore_patterns("metadata"))
    manifest = json.loads((artefact / MANIFEST_FILE).read_text())
    del manifest["rendering"]  # as the build wrote it before it recorded one
    (artefact / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    before = ArtefactBundle.from_pretrained(artefact)
    assert before.rendering is None and before.descriptions == {}

    after = record_rendering(artefact, FIXTURE)
    assert after.rendering == Rendering.of(read_code_descriptions(FIXTURE))
    assert after.descriptions == read_code_descriptions(FIXTURE)
    assert (artefact / DESCRIPTIONS_FILE).is_file()
    written = json.loads((artefact / MANIFEST_FILE).read_text())
    assert written.pop("rendering") == after.rendering.to_json()
    assert written == manifest  # id, base, content digest (the export's stamp), validation
    assert (after.artefact_id, after.validated) == (before.artefact_id, before.validated)
