"""The ledger's settings, declared once (`medtpe.core.declared`): the service settings and the
command line read each one's default and help from `LedgerSettings`, and `from_environ` reads
the same `MEDTPE_LEDGER_*` variables where there are no service settings (`medtpe verify`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from medtpe.core.declared import Declared, declared, described
from medtpe.core.paths import cache_dir
from medtpe.ledger.signing import Signer, signer_for

if TYPE_CHECKING:  # the store (SQLAlchemy) is imported when a ledger is opened
    from medtpe.ledger.store import Ledger

RecordsKept = Literal["digest", "store"]
LEDGER_FILE = "ledger.sqlite3"
SIGNING_KEY_FILE = "ledger-signing-key"


def default_url() -> str:
    """The embedded default: a SQLite file under the cache (`.cache/ledger.sqlite3`)."""
    return f"sqlite:///{cache_dir() / LEDGER_FILE}"


def default_key_file() -> Path:
    """Where the signing key of a local SQLite ledger is kept when none is configured."""
    return cache_dir() / SIGNING_KEY_FILE


@dataclass(frozen=True)
class LedgerSettings:
    """Where predictions are recorded and how their receipts are signed."""

    ledger_url: str = field(
        default_factory=default_url,
        metadata=described(
            "The prediction ledger's database: `sqlite:///PATH` (WAL; the default, "
            "`.cache/ledger.sqlite3`) or `postgresql://user:password@host:port/db` (every API "
            "process and replica on one PostgreSQL; psycopg 3). Migrated to the newest schema "
            "on start."
        ),
    )
    ledger_records: RecordsKept = field(
        default="digest",
        metadata=described(
            "`digest`: a ledger row keeps the record's SHA-256 only; `store`: also the "
            "canonical record itself (the events the prediction read: PHI), so `medtpe verify` "
            "needs no `--meds`/`--fhir`."
        ),
    )
    ledger_signing_key: str | None = field(
        default=None,
        repr=False,
        metadata=described(
            "The Ed25519 private key that signs every receipt: PEM (PKCS#8) text or the base64 "
            "of its 32-byte seed. Required unless the ledger is a SQLite file; unset with "
            "SQLite: a key generated once and kept in `.cache/ledger-signing-key` (mode 0600)."
        ),
    )
    ledger_off: bool = field(
        default=False,
        metadata=described(
            "Answer without recording (no ledger row, no receipt); refused together with an "
            "address other machines reach, like an open start."
        ),
    )

    def __post_init__(self) -> None:
        if self.ledger_records not in get_args(RecordsKept):
            choices = " or ".join(get_args(RecordsKept))
            raise ValueError(f"MEDTPE_LEDGER_RECORDS={self.ledger_records!r}: expected {choices}")

    @classmethod
    def declared(cls, name: str) -> Declared:
        """The declaration of setting `name` (its default and help)."""
        return declared(cls, name)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> LedgerSettings:
        """The settings of the `MEDTPE_LEDGER_*` variables in `environ` (default: this
        process's), defaults for those unset."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name in ("ledger_url", "ledger_records", "ledger_signing_key"):
            if (value := env.get(f"MEDTPE_{name.upper()}")) not in (None, ""):
                values[name] = value
        if (off := env.get("MEDTPE_LEDGER_OFF")) not in (None, ""):
            values["ledger_off"] = off.strip().lower() in ("1", "true", "yes", "on")
        return cls(**values)  # type: ignore[arg-type]

    def open_ledger(self) -> Ledger:
        """The ledger these settings name, migrated (`Ledger.open`; `LedgerUnavailable`)."""
        from medtpe.ledger.store import Ledger

        return Ledger.open(self.ledger_url, keep_records=self.ledger_records == "store")

    def signer(self) -> Signer:
        """The receipts' signer (`medtpe.ledger.signing.signer_for`; `SigningKeyError` without the
        key a shared ledger requires)."""
        return signer_for(self.ledger_url, self.ledger_signing_key, default_key_file())
