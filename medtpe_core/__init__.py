"""MedTPE core: pure Python (no torch), one package a topic.

- `medtpe_core.tokenizer`: the MedTPE tokenizer, vocabulary mining, replacement, artefact files;
- `medtpe_core.meds`: MEDS events, datasets, label files, the subject split;
- `medtpe_core.prompt`: a record rendered as text, windowed, in the task's chat prompt;
- `medtpe_core.tasks`: the prediction tasks and their answer contract;
- `medtpe_core.metrics`: scores with patient-level bootstrap intervals, fidelity, compression;
- `medtpe_core.fhir`: FHIR R4 records as MEDS events;
- `medtpe_core.cds`: CDS Hooks logic without HTTP (services, risk bands, cards, score cache).

Beside them: `paths` (default locations), `declared` (options declared once), `ray_cluster`
(a Ray session for `--ray`), `rope_stretch` (RoPE's slow dimensions stretched).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from medtpe_core.tokenizer import MedTPETokenizer

__all__ = ["MedTPETokenizer"]


def __getattr__(name: str) -> Any:
    """Lazy exports, so importing a light submodule does not load the tokenizer stack."""
    if name == "MedTPETokenizer":
        from medtpe_core.tokenizer import MedTPETokenizer

        return MedTPETokenizer
    raise AttributeError(name)
