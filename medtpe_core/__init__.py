"""MedTPE core: pure Python (no torch), the tokenizer, MEDS data, rendering, tasks, metrics."""

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
