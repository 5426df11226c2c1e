"""A MedTPE artefact on disk as one bundle: its files, its manifest, what it was validated at.

The bundle is a directory: `medtpe.json` (merge table, id map, base fingerprint),
`embeddings.safetensors` (the trained rows), the detokenizer `tokenizer.json` and the base
model's tokenizer files, and `manifest.json`:

    {"format_version": 1, "artefact_id": "ce0cf8916a53", "base_fingerprint": "bf34...",
     "content_digest": "sha256 of medtpe.json and embeddings.safetensors",
     "validated": {"8192": {<fidelity figures at that budget>}, ...},
     "rendering": {"render_version": 1, "descriptions_file": "metadata/codes.parquet",
                   "descriptions_sha256": "47d0...", "n_descriptions": 5748}}

`validated` names the input budgets (original-tokenizer tokens) at which the build's fidelity gate
passed (`medtpe.training.fidelity_gate`); a service whose budget is above them serves untested
ground. The manifest is written by the build after its gate; its digest ties it to the files it
vouches for, so changed rows or merges make it stale (`ManifestError`).

`rendering` records how the build turned records into the text it mined and trained on: the
renderer's version (`medtpe.core.prompt.render.RENDER_VERSION`) and the code descriptions, shipped
in the artefact as a MEDS codes table (`metadata/codes.parquet`: `code`, `description`) with the
sha256 of their canonical content (`descriptions_digest`). The table is outside
`content_digest` (the artefact id and the export stay those of the merges and rows); a table
that no longer matches its digest is a `ManifestError` too. A model that renders otherwise (other
descriptions, another renderer version) is told so by `check_rendering`.

>>> bundle = ArtefactBundle.from_pretrained("artefacts/smollm2-135m-icu")  # doctest: +SKIP
>>> bundle.validated_budgets  # doctest: +SKIP
(4096, 8192)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import meds

from medtpe.core.meds.readers import read_code_descriptions, write_code_descriptions
from medtpe.core.prompt.layout import DEFAULT_LAYOUT, LEGACY_LAYOUT, PromptLayout
from medtpe.core.prompt.render import RENDER_VERSION
from medtpe.core.tokenizer.artefact_files import FORMAT_VERSION, MEDTPE_FILE

ROWS_FILE = "embeddings.safetensors"
MANIFEST_FILE = "manifest.json"
DIGESTED_FILES = (MEDTPE_FILE, ROWS_FILE)
"""The files whose content defines an artefact (merge table and trained rows)."""
DESCRIPTIONS_FILE = meds.code_metadata_filepath
"""The code descriptions the artefact's text was rendered with, as a MEDS codes table inside it
(`metadata/codes.parquet`): an artefact directory is also a `codes_dir`."""


class ManifestError(ValueError):
    """An artefact's manifest is missing a field or does not match the artefact's files."""


def content_digest(directory: Path) -> str:
    """sha256 over the artefact's merge table and trained rows (names and bytes)."""
    digest = hashlib.sha256()
    for name in DIGESTED_FILES:
        digest.update(name.encode())
        digest.update((Path(directory) / name).read_bytes())
    return digest.hexdigest()


def descriptions_digest(descriptions: Mapping[str, str]) -> str:
    """sha256 of a descriptions mapping's canonical content: its (code, description) pairs
    sorted, as compact JSON (UTF-8); equal mappings have equal digests whatever file held them."""
    canonical = json.dumps(sorted(descriptions.items()), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Rendering:
    """How records become text: the renderer's version, the code descriptions used and the
    prompt layout (`task-first` in a manifest that names none)."""

    render_version: int
    descriptions_sha256: str
    n_descriptions: int
    prompt_layout: str = LEGACY_LAYOUT.value

    @classmethod
    def of(
        cls, descriptions: Mapping[str, str], layout: PromptLayout = DEFAULT_LAYOUT
    ) -> Rendering:
        """The rendering of this process (`RENDER_VERSION`) with `descriptions` in `layout`."""
        return cls(
            RENDER_VERSION, descriptions_digest(descriptions), len(descriptions), layout.value
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rendering:
        """From a manifest's `rendering` object."""
        return cls(
            int(data["render_version"]),
            str(data["descriptions_sha256"]),
            int(data["n_descriptions"]),
            str(PromptLayout(data.get("prompt_layout", LEGACY_LAYOUT)).value),
        )

    def to_json(self) -> dict[str, Any]:
        """The manifest's `rendering` object (naming the table file when there is one)."""
        return asdict(self) | {
            "descriptions_file": DESCRIPTIONS_FILE if self.n_descriptions else None
        }

    def differences(self, built: Rendering) -> list[str]:
        """How this rendering differs from the artefact's build `built`, in words (empty: the
        same text)."""
        out = []
        if self.descriptions_sha256 != built.descriptions_sha256:
            out.append(
                f"code descriptions {_table(self)}, the artefact was built with {_table(built)}"
            )
        if self.render_version != built.render_version:
            out.append(
                f"renderer version {self.render_version}, the artefact was built with version "
                f"{built.render_version}"
            )
        if self.prompt_layout != built.prompt_layout:
            out.append(
                f"prompt layout {self.prompt_layout}, the artefact was built with "
                f"{built.prompt_layout}"
            )
        return out


def _table(rendering: Rendering) -> str:
    if not rendering.n_descriptions:
        return "none (codes shown by their names)"
    return f"{rendering.n_descriptions:,} codes (sha256 {rendering.descriptions_sha256[:12]})"


DescriptionsSource = Literal["artefact", "supplemented", "override", "none"]


@dataclass(frozen=True)
class RenderingCheck:
    """How a loaded model renders records, against its artefact's build (`/readyz`)."""

    descriptions: DescriptionsSource
    """`artefact`: the artefact's own table; `supplemented`: the artefact's, and a site's table
    (`codes_dir`) for codes it does not describe; `override`: a table configured instead
    (`codes_dir` with `codes_replace`); `none`: no descriptions (codes shown by their names)."""
    matches_artefact: bool | None
    """Whether prompts are rendered as the build rendered its text (None: the artefact's
    manifest records no rendering)."""
    digest: str
    """sha256 of the descriptions in use (`descriptions_digest`)."""
    n_descriptions: int
    render_version: int
    differences: tuple[str, ...]
    """What differs from the build, in words."""


def check_rendering(
    bundle: ArtefactBundle,
    descriptions: Mapping[str, str],
    overridden: bool,
    layout: PromptLayout = DEFAULT_LAYOUT,
) -> RenderingCheck:
    """This process's rendering with `descriptions` (`overridden`: configured instead of the
    artefact's table; else the artefact's, supplemented when they describe more codes) in
    `layout` against what `bundle`'s manifest records of its build."""
    used = Rendering.of(descriptions, layout)
    differences = () if bundle.rendering is None else tuple(used.differences(bundle.rendering))
    source: DescriptionsSource = "override" if overridden else "artefact"
    if not descriptions:
        source = "none"
    elif not overridden and not descriptions.keys() <= bundle.descriptions.keys():
        source = "supplemented"
    return RenderingCheck(
        descriptions=source,
        matches_artefact=None if bundle.rendering is None else not differences,
        digest=used.descriptions_sha256,
        n_descriptions=used.n_descriptions,
        render_version=used.render_version,
        differences=differences,
    )


@dataclass(frozen=True)
class ArtefactBundle:
    """An artefact directory and what its manifest says of it."""

    path: Path
    artefact_id: str
    base_fingerprint: str
    validated: Mapping[int, Mapping[str, Any]]
    """{input budget: the fidelity figures its gate measured there}; empty without a manifest."""
    rendering: Rendering | None = None
    """How the build rendered its text; None when the manifest records none (or is absent)."""
    descriptions: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    """The artefact's code descriptions (`DESCRIPTIONS_FILE`; empty without one)."""

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ArtefactBundle:
        """The bundle in `path`; `ManifestError` when its manifest is stale or malformed (an
        artefact without a manifest is valid at no budget)."""
        path = Path(path)
        medtpe = json.loads((path / MEDTPE_FILE).read_text())
        descriptions = read_code_descriptions(path)
        manifest_path = path / MANIFEST_FILE
        validated: dict[int, Mapping[str, Any]] = {}
        rendering = None
        if manifest_path.is_file():
            manifest = json.loads(manifest_path.read_text())
            try:
                if manifest["content_digest"] != content_digest(path):
                    raise ManifestError(
                        f"{manifest_path} vouches for other files than {path} holds (its "
                        "merges or rows changed since it was validated): rebuild the artefact"
                    )
                validated = {int(b): figures for b, figures in manifest["validated"].items()}
                if "rendering" in manifest:
                    rendering = Rendering.from_json(manifest["rendering"])
            except (KeyError, TypeError, ValueError) as exc:
                if isinstance(exc, ManifestError):
                    raise
                raise ManifestError(f"{manifest_path}: malformed ({exc!r})") from exc
            shipped = Rendering.of(descriptions)
            if (
                rendering is not None
                and shipped.descriptions_sha256 != rendering.descriptions_sha256
            ):
                raise ManifestError(
                    f"{path / DESCRIPTIONS_FILE} holds other code descriptions than "
                    f"{manifest_path} records of the build ({_table(shipped)}, recorded "
                    f"{_table(rendering)}): restore the table the artefact was built with, or "
                    "rebuild the artefact"
                )
        return cls(
            path,
            medtpe["artefact_id"],
            medtpe["base"]["fingerprint"],
            validated,
            rendering,
            descriptions,
        )

    @property
    def rows_path(self) -> Path:
        """The trained embedding rows."""
        return self.path / ROWS_FILE

    @property
    def validated_budgets(self) -> tuple[int, ...]:
        """The input budgets the artefact passed its fidelity gate at, ascending."""
        return tuple(sorted(self.validated))

    def digest(self) -> str:
        """The content digest of the bundle's files now."""
        return content_digest(self.path)

    def write_manifest(
        self, validated: Mapping[int, Mapping[str, Any]], rendering: Rendering | None = None
    ) -> ArtefactBundle:
        """Write `manifest.json` vouching for the files as they are now, validated at these
        budgets, with the build's `rendering` (None: the bundle's own; written atomically);
        returns the bundle as the manifest describes it."""
        rendering = rendering or self.rendering
        manifest: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "artefact_id": self.artefact_id,
            "base_fingerprint": self.base_fingerprint,
            "content_digest": self.digest(),
            "validated": {str(b): dict(figures) for b, figures in sorted(validated.items())},
        }
        if rendering is not None:
            manifest["rendering"] = rendering.to_json()
        tmp = self.path / (MANIFEST_FILE + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(tmp, self.path / MANIFEST_FILE)
        return ArtefactBundle.from_pretrained(self.path)

    def save_descriptions(self, descriptions: Mapping[str, str]) -> Rendering:
        """Write the code descriptions the artefact's text is rendered with into it
        (`DESCRIPTIONS_FILE`; none: the file removed); returns the rendering for its manifest
        (`write_manifest`)."""
        table = self.path / DESCRIPTIONS_FILE
        if descriptions:
            write_code_descriptions(self.path, descriptions)
        else:
            table.unlink(missing_ok=True)
        return Rendering.of(descriptions)


def unvalidated_budget_message(bundle: ArtefactBundle, budget: int) -> str | None:
    """Why serving `budget` with this artefact is untested (None when a validated budget covers
    it: the largest validated budget is at least `budget`)."""
    budgets = bundle.validated_budgets
    if budgets and budget <= budgets[-1]:
        return None
    where = f"at {', '.join(map(str, budgets))} tokens" if budgets else "at no budget (no manifest)"
    return (
        f"the MedTPE artefact {bundle.artefact_id} was validated {where}; this service's input "
        f"budget is {budget} tokens"
    )
