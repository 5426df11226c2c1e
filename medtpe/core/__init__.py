"""MedTPE core: pure Python (no torch), one package a topic.

- `medtpe.core.tokenizer`: the MedTPE tokenizer, vocabulary mining, replacement, artefact files;
- `medtpe.core.meds`: MEDS events, datasets, label files, the subject split;
- `medtpe.core.prompt`: a record rendered as text, windowed, in the task's chat prompt;
- `medtpe.core.tasks`: the prediction tasks and their answer contract;
- `medtpe.core.metrics`: scores with patient-level bootstrap intervals, fidelity, compression;
- `medtpe.core.fhir`: FHIR R4 records as MEDS events;
- `medtpe.core.cds`: CDS Hooks logic without HTTP (services, risk bands, cards, score cache).

Beside them: `paths` (default locations), `declared` (options declared once), `figure_names`
(an answer's figures named as the ledger names them, and their earlier keys), `ray_cluster`
(a Ray session for `--ray`), `rope_stretch` (RoPE's slow dimensions stretched),
`secret_masking` (secrets kept out of log lines and messages), `thresholds` (a task's operating
threshold on p("yes")).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from medtpe.core.tokenizer import MedTPETokenizer

__all__ = [
    "MedTPETokenizer",
    "answer_facts",
    "cds",
    "declared",
    "fhir",
    "figure_names",
    "meds",
    "metrics",
    "paths",
    "prompt",
    "ray_cluster",
    "rope_stretch",
    "secret_masking",
    "tasks",
    "thresholds",
    "tokenizer",
]


def __getattr__(name: str) -> Any:
    """Lazy exports, so importing a light submodule does not load the tokenizer stack."""
    if name == "MedTPETokenizer":
        from medtpe.core.tokenizer import MedTPETokenizer

        return MedTPETokenizer
    raise AttributeError(name)
