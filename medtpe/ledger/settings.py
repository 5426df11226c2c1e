"""The ledger's settings, declared once (`medtpe.core.declared`) and read from the environment
here (`from_environ`: `MEDTPE_LEDGER_URL`, `MEDTPE_LEDGER_RECORDS`, `MEDTPE_LEDGER_SIGNING_KEY`,
`MEDTPE_LEDGER_OFF`, `MEDTPE_LEDGER_STATEMENT_TIMEOUT_S`, `MEDTPE_LEDGER_LOCK_TIMEOUT_S`,
`MEDTPE_LEDGER_CHECKPOINT_ROWS`), strictly: a value that is no boolean, no ledger URL, no kind of
records, no positive number of seconds or no row count is an error naming the variable and what
it accepts.

The timeouts bound every wait on the database (`DatabaseTimeouts`): a statement past
`ledger_statement_timeout_s`, or a lock not granted within `ledger_lock_timeout_s`, is cancelled
by the database and is a `LedgerUnavailable` (the service's 503 `ledger_unavailable`); their
defaults fit well inside the service's request deadline (`MEDTPE_REQUEST_TIMEOUT_S`, 300 s).

The service's settings hold a `LedgerSettings` (`ServiceSettings.ledger`); the batch job and the
command line read their own.

`open_ledger` is the one way a ledger is opened: by the service, the batch job, `medtpe
outcomes`, `medtpe monitor`, `medtpe verify` and `medtpe ledger`."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from medtpe.core.declared import Declared, declared, described
from medtpe.core.paths import cache_dir
from medtpe.core.secret_masking import mask_secrets, url_secrets
from medtpe.ledger.signing import Signer, parse_private_key, read_key_file, signer_for

if TYPE_CHECKING:  # the store (SQLAlchemy) is imported when a ledger is opened
    from medtpe.ledger.store import Ledger

RecordsKept = Literal["digest", "store"]
LEDGER_FILE = "ledger.sqlite3"
SIGNING_KEY_FILE = "ledger-signing-key"
VARIABLE_PREFIX = "MEDTPE_"
URL_BACKENDS = ("sqlite", "postgresql", "postgres")
"""The databases a ledger URL may name (its scheme before any `+driver`)."""
URL_FORMS = "sqlite:///PATH or postgresql://user:password@host:port/db"
BOOLEAN_WORDS = (
    ("true", "false"),
    ("1", "0"),
    ("yes", "no"),
    ("on", "off"),
    ("t", "f"),
    ("y", "n"),
)
"""The (true, false) words a boolean variable accepts, in any case: those of every other
`MEDTPE_*` boolean (pydantic's)."""
BOOLEANS = {yes: True for yes, _ in BOOLEAN_WORDS} | {no: False for _, no in BOOLEAN_WORDS}
NONE = "none"
"""The value of an optional variable that says unset (as every other `MEDTPE_*` setting)."""
STATEMENT_TIMEOUT_S = 30.0
"""The longest a ledger statement may run by default."""
LOCK_TIMEOUT_S = 10.0
"""The longest a ledger statement may wait for a lock by default."""
CHECKPOINT_ROWS = 1_000
"""Rows between the ledger's automatic chain checkpoints by default."""


@dataclass(frozen=True)
class DatabaseTimeouts:
    """How long the ledger's database may keep a caller waiting, in seconds: a statement in all
    (PostgreSQL's `statement_timeout`), and for a lock (PostgreSQL's `lock_timeout`, SQLite's
    `busy_timeout`)."""

    statement_s: float = STATEMENT_TIMEOUT_S
    lock_s: float = LOCK_TIMEOUT_S


class LedgerMissing(ValueError):
    """The ledger a reading command names does not exist (a SQLite path of no file): such a
    command never creates it (`LedgerSettings.open_ledger(existing=True)`)."""


def default_url() -> str:
    """The embedded default: a SQLite file under the cache (`.cache/ledger.sqlite3`)."""
    return f"sqlite:///{cache_dir() / LEDGER_FILE}"


def default_key_file() -> Path:
    """Where the signing key of a local SQLite ledger is kept when none is configured."""
    return cache_dir() / SIGNING_KEY_FILE


def variable(name: str) -> str:
    """The environment variable of setting `name` (`ledger_url`: `MEDTPE_LEDGER_URL`)."""
    return f"{VARIABLE_PREFIX}{name.upper()}"


def parse_boolean(name: str, value: object) -> bool:
    """Setting `name`'s value as a boolean: a bool, or one of `BOOLEANS` (any case); anything
    else a ValueError naming its variable and the accepted words."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in BOOLEANS:
        return BOOLEANS[value.lower()]
    words = ", ".join("/".join(pair) for pair in BOOLEAN_WORDS)
    raise ValueError(f"{variable(name)}={value!r}: expected a boolean ({words})")


def parse_text(name: str, value: object) -> str:
    """A text setting's value (what it must hold is checked on construction)."""
    return str(value)


def parse_optional(name: str, value: object) -> str | None:
    """An optional text setting: `none` (or None) is unset."""
    return None if value is None or value == NONE else str(value)


def parse_seconds(name: str, value: object) -> float:
    """A duration setting's value: a positive, finite number of seconds; anything else a
    ValueError naming its variable."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not (0 < seconds < math.inf):
        raise ValueError(f"{variable(name)}={value!r}: expected a positive number of seconds")
    return seconds


def parse_count(name: str, value: object) -> int:
    """A count setting's value: a whole number, 0 or more; anything else a ValueError naming its
    variable."""
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, str) and value.strip().isdigit():
        count = int(value)
    else:
        count = -1
    if count < 0:
        raise ValueError(f"{variable(name)}={value!r}: expected a whole number, 0 or more")
    return count


_PARSERS: Mapping[str, Callable[[str, object], Any]] = {
    "ledger_url": parse_text,
    "ledger_records": parse_text,
    "ledger_signing_key": parse_optional,
    "ledger_off": parse_boolean,
    "ledger_statement_timeout_s": parse_seconds,
    "ledger_lock_timeout_s": parse_seconds,
    "ledger_checkpoint_rows": parse_count,
}
"""How each setting's text (or a caller's value) is read; the rest is checked on construction."""


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
    ledger_statement_timeout_s: float = field(
        default=STATEMENT_TIMEOUT_S,
        metadata=described(
            "The longest one ledger statement may run, lock waits included (PostgreSQL's "
            "`statement_timeout` on every connection); past it the database cancels it: the "
            "service answers 503 `ledger_unavailable`, a command stops naming the ledger."
        ),
    )
    ledger_lock_timeout_s: float = field(
        default=LOCK_TIMEOUT_S,
        metadata=described(
            "The longest one ledger statement may wait for a lock another connection holds "
            "(PostgreSQL's `lock_timeout`, SQLite's `busy_timeout`): a table locked by a "
            "migration or an index build is a 503 `ledger_unavailable` after this long."
        ),
    )
    ledger_checkpoint_rows: int = field(
        default=CHECKPOINT_ROWS,
        metadata=described(
            "Every this many rows, the writer that appends the row signs the ledger's hash chain "
            "at that row (its digest and row count, with the signing key) in a checkpoint kept "
            "in the ledger (`medtpe ledger audit` checks them; `medtpe ledger checkpoint` signs "
            "one at once and prints it); 0: only `medtpe ledger checkpoint`."
        ),
    )

    def __post_init__(self) -> None:
        if self.ledger_records not in get_args(RecordsKept):
            choices = " or ".join(get_args(RecordsKept))
            raise ValueError(
                f"{variable('ledger_records')}={self.ledger_records!r}: expected {choices}"
            )
        scheme, separator, _ = self.ledger_url.partition("://")
        if not separator or scheme.partition("+")[0].lower() not in URL_BACKENDS:
            raise ValueError(
                f"{variable('ledger_url')}={mask_secrets(self.ledger_url)!r}: expected {URL_FORMS}"
            )
        parse_boolean("ledger_off", self.ledger_off)
        parse_seconds("ledger_statement_timeout_s", self.ledger_statement_timeout_s)
        parse_seconds("ledger_lock_timeout_s", self.ledger_lock_timeout_s)
        parse_count("ledger_checkpoint_rows", self.ledger_checkpoint_rows)

    def __repr__(self) -> str:
        """The settings without the signing key, the URL's password masked."""
        return (
            f"LedgerSettings(ledger_url={mask_secrets(self.ledger_url)!r}, "
            f"ledger_records={self.ledger_records!r}, ledger_off={self.ledger_off!r}, "
            f"ledger_statement_timeout_s={self.ledger_statement_timeout_s!r}, "
            f"ledger_lock_timeout_s={self.ledger_lock_timeout_s!r}, "
            f"ledger_checkpoint_rows={self.ledger_checkpoint_rows!r})"
        )

    @classmethod
    def declared(cls, name: str) -> Declared:
        """The declaration of setting `name` (its default and help)."""
        return declared(cls, name)

    @classmethod
    def variables(cls) -> dict[str, str]:
        """Each setting's environment variable and its help."""
        return {variable(option.name): cls.declared(option.name).help for option in fields(cls)}

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str] | None = None, **given: object
    ) -> LedgerSettings:
        """The settings of the `MEDTPE_LEDGER_*` variables in `environ` (default: this
        process's; names in any case, an empty value unset), each setting in `given` (by field
        name: `ledger_url=`, `ledger_off=`) in place of its variable, defaults for the rest.
        A value these settings do not accept: a ValueError naming its variable."""
        env = os.environ if environ is None else environ
        texts = {name.upper(): text for name, text in env.items() if text != ""}
        unknown = set(given) - set(_PARSERS)
        if unknown:
            raise TypeError(f"no ledger setting {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        for name, parse in _PARSERS.items():
            if name in given:
                values[name] = parse(name, given[name])
            elif (text := texts.get(variable(name))) is not None:
                values[name] = parse(name, text)
        return cls(**values)

    def secrets(self) -> list[str]:
        """The secret values among these settings: the signing key, the URL's password and
        tokens (`medtpe.core.secret_masking`)."""
        key = [self.ledger_signing_key] if self.ledger_signing_key else []
        return key + url_secrets(self.ledger_url)

    def require_signing_key(self) -> None:
        """The signing key parses, a ledger other than a local SQLite file has one (every
        process and replica signs with the same key), and a local key file already there is
        one only its owner may open (`medtpe.ledger.signing.read_key_file`); a
        `SigningKeyError` otherwise."""
        if self.ledger_signing_key:
            parse_private_key(self.ledger_signing_key)
        elif not self.ledger_url.startswith("sqlite"):
            signer_for(self.ledger_url, None, default_key_file())
        elif default_key_file().exists():
            read_key_file(default_key_file())

    def open_ledger(self, *, existing: bool = False) -> Ledger:
        """The ledger these settings name, migrated to the newest schema, its records kept as
        `ledger_records` says, every wait on it bounded by `timeouts`, its chain checkpointed
        every `ledger_checkpoint_rows` rows with `signer` (asked when the first is due): the one
        way a ledger is opened (`LedgerUnavailable`).
        `existing`: the ledger must already be there, as for a command that only reads it
        (`medtpe verify`, `outcomes`, `monitor`): a SQLite path of no file is a `LedgerMissing`
        naming it, never a new, empty ledger (a PostgreSQL database that does not exist is a
        `LedgerUnavailable` anyway); the writers (the service, `medtpe predict`, `medtpe
        ledger upgrade`) create it."""
        if existing:
            self._require_existing()
        from medtpe.ledger.store import Ledger

        return Ledger.open(
            self.ledger_url,
            keep_records=self.ledger_records == "store",
            timeouts=self.timeouts(),
            checkpoint_every=self.ledger_checkpoint_rows,
            signer=self.signer,
        )

    def timeouts(self) -> DatabaseTimeouts:
        """The bounds of every wait on the ledger's database."""
        return DatabaseTimeouts(self.ledger_statement_timeout_s, self.ledger_lock_timeout_s)

    def _require_existing(self) -> None:
        """A `LedgerMissing` when the ledger is a SQLite file that does not exist."""
        from sqlalchemy.engine import make_url

        url = make_url(self.ledger_url)
        if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
            return
        if "uri" in url.query:  # a `file:` URI: SQLite reads it, its path is no plain path
            return
        path = Path(url.database)
        if not path.is_file():
            raise LedgerMissing(
                f"no ledger at {path}: check {variable('ledger_url')} or --ledger (a SQLite "
                "ledger is created by the service, `medtpe predict` or `medtpe ledger upgrade`)"
            )

    def signer(self) -> Signer:
        """The receipts' signer (`medtpe.ledger.signing.signer_for`; `SigningKeyError` without the
        key a shared ledger requires)."""
        return signer_for(self.ledger_url, self.ledger_signing_key, default_key_file())
