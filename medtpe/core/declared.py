"""Options declared once: a dataclass field that carries its help beside its default.

The engine's and the model's options (`medtpe.inference.engines.protocol.EngineOptions`,
`medtpe.inference.model.ModelConfig`, `medtpe.core.prompt.windowing.Windowing`) are declared as
`field(default=..., metadata=described("help"))`; the service settings and the CLI read each one's
default and help with `declared`, so neither copies a default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

_HELP = "help"


def described(help: str) -> Mapping[str, str]:
    """The metadata of a dataclass field whose help is `help`."""
    return {_HELP: help}


@dataclass(frozen=True)
class Declared:
    """One declared option: its field name, default (or factory) and help."""

    name: str
    default: Any
    """The default; `MISSING` when a `factory` makes it."""
    factory: Callable[[], Any] | None
    help: str

    def value(self) -> Any:
        """The default value (the factory's, called now)."""
        return self.factory() if self.factory is not None else self.default


def declared(cls: type, name: str) -> Declared:
    """The declaration of option `name` of the dataclass `cls` (KeyError: no such field)."""
    found = {f.name: f for f in fields(cls)}[name]
    factory = None if found.default_factory is MISSING else found.default_factory
    return Declared(name, found.default, factory, found.metadata.get(_HELP, ""))
