"""An artefact's rendering record (`medtpe.core.tokenizer.artefact_manifest`): the code descriptions
table it ships and the renderer's version in its manifest, checked when it is loaded and against
what a model renders with."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from medtpe.core.meds.readers import read_code_descriptions, write_code_descriptions
from medtpe.core.paths import default_artefact_dir
from medtpe.core.prompt.layout import PromptLayout
from medtpe.core.prompt.render import RENDER_VERSION
from medtpe.core.tokenizer.artefact_manifest import (
    DESCRIPTIONS_FILE,
    DIGESTED_FILES,
    MANIFEST_FILE,
    ArtefactBundle,
    ManifestError,
    Rendering,
    check_rendering,
    content_digest,
    descriptions_digest,
)
from tests.support.paths import DEFAULT_ARTEFACT_ID


@pytest.fixture
def artefact(tmp_path: Path) -> Path:
    """A copy of the default artefact's merges, rows, manifest and descriptions table."""
    copy = tmp_path / "artefact"
    for name in (*DIGESTED_FILES, MANIFEST_FILE, DESCRIPTIONS_FILE):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(default_artefact_dir() / name, copy / name)
    return copy


def test_the_default_artefact_records_the_text_it_was_built_on() -> None:
    bundle = ArtefactBundle.from_pretrained(default_artefact_dir())
    manifest = json.loads((default_artefact_dir() / MANIFEST_FILE).read_text())
    assert bundle.artefact_id == manifest["artefact_id"] == DEFAULT_ARTEFACT_ID
    assert manifest["content_digest"] == content_digest(default_artefact_dir())
    assert bundle.rendering == Rendering.of(bundle.descriptions)
    assert bundle.rendering.render_version == RENDER_VERSION
    assert manifest["rendering"]["descriptions_file"] == DESCRIPTIONS_FILE
    assert bundle.descriptions["LAB//220045//bpm"] == "Heart Rate [bpm]"


def test_the_digest_is_of_the_content_not_the_file(tmp_path: Path) -> None:
    table = {"B//2": "Beta [mg]", "A//1": "Alpha"}
    write_code_descriptions(tmp_path, table)
    assert read_code_descriptions(tmp_path) == table
    assert descriptions_digest(read_code_descriptions(tmp_path)) == descriptions_digest(
        dict(reversed(table.items()))
    )
    assert descriptions_digest(table) != descriptions_digest(table | {"A//1": "Alpha "})
    assert descriptions_digest({}) != descriptions_digest({"": ""})


def test_a_changed_table_is_refused(artefact: Path) -> None:
    table = read_code_descriptions(artefact)
    write_code_descriptions(artefact, table | {"LAB//220045//bpm": "Pulse [bpm]"})
    with pytest.raises(ManifestError, match="other code descriptions"):
        ArtefactBundle.from_pretrained(artefact)
    (artefact / DESCRIPTIONS_FILE).unlink()  # a table gone is no table
    with pytest.raises(ManifestError, match="none \\(codes shown by their names\\)"):
        ArtefactBundle.from_pretrained(artefact)


def test_a_model_rendering_otherwise_is_told_how(artefact: Path) -> None:
    bundle = ArtefactBundle.from_pretrained(artefact)
    own = dict(bundle.descriptions)
    same = check_rendering(bundle, own, overridden=True)  # an equal table elsewhere
    assert (same.descriptions, same.matches_artefact, same.differences) == ("override", True, ())
    default = check_rendering(bundle, bundle.descriptions, overridden=False)
    assert default.descriptions == "artefact" and default.matches_artefact is True
    other = check_rendering(bundle, {"LAB//220045//bpm": "Heart Rate [bpm]"}, overridden=True)
    assert other.matches_artefact is False and other.n_descriptions == 1
    assert other.differences == (
        f"code descriptions 1 codes (sha256 {other.digest[:12]}), the artefact was built with "
        f"{len(own):,} codes (sha256 {bundle.rendering.descriptions_sha256[:12]})",
    )
    none = check_rendering(bundle, {}, overridden=True)
    assert none.descriptions == "none" and none.matches_artefact is False
    assert "code descriptions none (codes shown by their names)" in none.differences[0]


def test_another_renderer_version_does_not_match(artefact: Path) -> None:
    bundle = ArtefactBundle.from_pretrained(artefact)
    built = bundle.rendering
    older = Rendering(
        RENDER_VERSION - 1, built.descriptions_sha256, len(bundle.descriptions), built.prompt_layout
    )
    bundle = bundle.write_manifest(bundle.validated, older)
    check = check_rendering(bundle, bundle.descriptions, overridden=False)
    assert check.matches_artefact is False
    assert check.differences == (
        f"renderer version {RENDER_VERSION}, the artefact was built with version "
        f"{RENDER_VERSION - 1}",
    )


def test_an_artefact_that_records_no_rendering_cannot_be_compared(artefact: Path) -> None:
    manifest = json.loads((artefact / MANIFEST_FILE).read_text())
    del manifest["rendering"]
    (artefact / MANIFEST_FILE).write_text(json.dumps(manifest))
    bundle = ArtefactBundle.from_pretrained(artefact)
    assert bundle.rendering is None and bundle.validated_budgets == (4096, 8192)
    check = check_rendering(bundle, bundle.descriptions, overridden=False)
    assert check.matches_artefact is None and check.differences == ()


def test_saving_no_descriptions_removes_the_table(artefact: Path) -> None:
    bundle = ArtefactBundle.from_pretrained(artefact)
    bundle = bundle.write_manifest(bundle.validated, bundle.save_descriptions({}))
    assert not (artefact / DESCRIPTIONS_FILE).exists() and bundle.descriptions == {}
    manifest = json.loads((artefact / MANIFEST_FILE).read_text())
    assert manifest["rendering"]["descriptions_file"] is None
    assert manifest["rendering"]["n_descriptions"] == 0
    assert (
        bundle.artefact_id == DEFAULT_ARTEFACT_ID and bundle.digest() == manifest["content_digest"]
    )


def test_another_prompt_layout_does_not_match(artefact: Path) -> None:
    bundle = ArtefactBundle.from_pretrained(artefact)
    for layout in PromptLayout:
        built = dataclasses.replace(bundle.rendering, prompt_layout=layout.value)
        bundle = bundle.write_manifest(bundle.validated, built)
        other = next(o for o in PromptLayout if o is not layout)
        assert check_rendering(bundle, bundle.descriptions, False, layout).differences == ()
        check = check_rendering(bundle, bundle.descriptions, False, other)
        assert check.matches_artefact is False
        assert check.differences == (
            f"prompt layout {other.value}, the artefact was built with {layout.value}",
        )
