"""Default locations: the git-ignored cache, the default model, the committed artefact."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_ARTEFACT_NAME = "smollm2-135m-icu"


def project_root() -> Path:
    """The repository root (this package is installed editable from it)."""
    return Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Cache for built checkpoints: `$MEDTPE_CACHE_DIR`, default `<root>/.cache` (git-ignored)."""
    env = os.environ.get("MEDTPE_CACHE_DIR")
    return Path(env).expanduser().resolve() if env else project_root() / ".cache"


def default_model_dir() -> Path:
    """Hugging Face checkpoint of the default model, built by `medtpe prepare-model`."""
    return cache_dir() / "models" / DEFAULT_MODEL_NAME


def default_artefact_dir() -> Path:
    """The committed MedTPE artefact for the default model (`$MEDTPE_ARTEFACT_DIR` overrides)."""
    env = os.environ.get("MEDTPE_ARTEFACT_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return project_root() / "artefacts" / DEFAULT_ARTEFACT_NAME


def default_export_dir() -> Path:
    """Exported checkpoint (base + MedTPE rows and tokenizer) that vLLM loads."""
    return cache_dir() / "export" / DEFAULT_ARTEFACT_NAME
