"""A MedTPE artefact on disk as one bundle: its files, its manifest, what it was validated at.

The bundle is a directory: `medtpe.json` (merge table, id map, base fingerprint),
`embeddings.safetensors` (the trained rows), the detokenizer `tokenizer.json` and the base
model's tokenizer files, and `manifest.json`:

    {"format_version": 1, "artefact_id": "ce0cf8916a53", "base_fingerprint": "bf34...",
     "content_digest": "sha256 of medtpe.json and embeddings.safetensors",
     "validated": {"8192": {<fidelity figures at that budget>}, ...}}

`validated` names the input budgets (original-tokenizer tokens) at which the build's fidelity gate
passed (`training.fidelity_gate`); a service whose budget is above them serves untested ground.
The manifest is written by the build after its gate; its digest ties it to the files it vouches
for, so changed rows or merges make it stale (`ManifestError`).

>>> bundle = ArtefactBundle.from_pretrained("artifacts/smollm2-135m-icu")  # doctest: +SKIP
>>> bundle.validated_budgets  # doctest: +SKIP
(4096, 8192)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medtpe_core.artefact import FORMAT_VERSION, MEDTPE_FILE

ROWS_FILE = "embeddings.safetensors"
MANIFEST_FILE = "manifest.json"
DIGESTED_FILES = (MEDTPE_FILE, ROWS_FILE)
"""The files whose content defines an artefact (merge table and trained rows)."""


class ManifestError(ValueError):
    """An artefact's manifest is missing a field or does not match the artefact's files."""


def content_digest(directory: Path) -> str:
    """sha256 over the artefact's merge table and trained rows (names and bytes)."""
    digest = hashlib.sha256()
    for name in DIGESTED_FILES:
        digest.update(name.encode())
        digest.update((Path(directory) / name).read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class ArtefactBundle:
    """An artefact directory and what its manifest says of it."""

    path: Path
    artefact_id: str
    base_fingerprint: str
    validated: Mapping[int, Mapping[str, Any]]
    """{input budget: the fidelity figures its gate measured there}; empty without a manifest."""

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ArtefactBundle:
        """The bundle in `path`; `ManifestError` when its manifest is stale or malformed (an
        artefact without a manifest is valid at no budget)."""
        path = Path(path)
        medtpe = json.loads((path / MEDTPE_FILE).read_text())
        manifest_path = path / MANIFEST_FILE
        validated: dict[int, Mapping[str, Any]] = {}
        if manifest_path.is_file():
            manifest = json.loads(manifest_path.read_text())
            try:
                if manifest["content_digest"] != content_digest(path):
                    raise ManifestError(
                        f"{manifest_path} vouches for other files than {path} holds (its "
                        "merges or rows changed since it was validated): rebuild the artefact"
                    )
                validated = {int(b): figures for b, figures in manifest["validated"].items()}
            except (KeyError, TypeError, ValueError) as exc:
                if isinstance(exc, ManifestError):
                    raise
                raise ManifestError(f"{manifest_path}: malformed ({exc!r})") from exc
        return cls(path, medtpe["artefact_id"], medtpe["base"]["fingerprint"], validated)

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

    def write_manifest(self, validated: Mapping[int, Mapping[str, Any]]) -> ArtefactBundle:
        """Write `manifest.json` vouching for the files as they are now, validated at these
        budgets (written atomically); returns the bundle as the manifest describes it."""
        manifest = {
            "format_version": FORMAT_VERSION,
            "artefact_id": self.artefact_id,
            "base_fingerprint": self.base_fingerprint,
            "content_digest": self.digest(),
            "validated": {str(b): dict(figures) for b, figures in sorted(validated.items())},
        }
        tmp = self.path / (MANIFEST_FILE + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(tmp, self.path / MANIFEST_FILE)
        return ArtefactBundle(self.path, self.artefact_id, self.base_fingerprint, validated)


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
