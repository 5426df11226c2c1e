"""The predictions' hash chain: every row carries its place in the ledger (`chain_seq`: 1, 2, 3 …
without gaps, in the order rows were committed) and a digest of its content and of the row
before it (`chain_digest`), so a row deleted, inserted, moved or edited breaks the chain where it
was; signed checkpoints of the chain's head (`Checkpoint`) pin its state at a row count, so a
chain recomputed after such a change, or cut short, differs from what was signed.

Digests (SHA-256, hexadecimal):
- a row's (`row_digest`): of the canonical JSON (`medtpe.ledger.receipt.canonical_json`) of its
  columns `CHAINED_COLUMNS`, times as UTC ISO 8601 (`utc_text`), empty (NULL) columns left out:
  the receipt and its signature, and the columns the receipt does not sign;
- its link (`link`): of the previous row's link (32 bytes; `GENESIS` before the first row)
  followed by the row's digest (32 bytes); the row's `chain_digest`, the chain's digest at its
  row count.

Rows are appended under the chain's lock held to the commit (`lock_chain`: PostgreSQL's
transaction-scoped advisory lock `CHAIN_LOCK_KEY`, taken with the head's read by the function
`HEAD_FUNCTION`; SQLite's write lock, by `BEGIN IMMEDIATE`, or by the one statement that reads
the head and inserts an answer's row, `SQLITE_APPEND`), so
writers in several processes append one after the other; the database's role needs only SELECT
and INSERT."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select, text
from sqlalchemy.dialects import postgresql, sqlite

from medtpe.ledger.receipt import canonical_json, sha256_hex, utc_text
from medtpe.ledger.schema import ChainCheckpoint, Prediction
from medtpe.ledger.signing import Signer, verify_bytes

CHAIN_VERSION = 1
"""The version of the digests and of the checkpoints' signed bytes."""
GENESIS = "0" * 64
"""The link before the first row."""
CHAINED_COLUMNS = (
    "prediction_id",
    "created_at",
    "door",
    "caller",
    "site",
    "task",
    "subject_id",
    "prediction_time",
    "answer",
    "p_yes",
    "format_ok",
    "original_tokens",
    "medtpe_tokens",
    "compression_rate",
    "latency_ms",
    "mode",
    "silent",
    "shadow_of",
    "receipt",
    "signature",
    "key_id",
    "record",
)
"""The columns of `predictions` a row's digest covers: all but the chain's own."""
CHAIN_LOCK_KEY = 0x6D656474_7063
"""PostgreSQL's advisory lock of the chain's head ("medtpc"), held by each append to its commit."""
_PREDICTIONS = Prediction.__table__
_CHECKPOINTS = ChainCheckpoint.__table__


def row_digest(values: Mapping[str, Any]) -> str:
    """The digest of one row's `CHAINED_COLUMNS` in `values` (as written or as read back)."""
    content = {}
    for name in CHAINED_COLUMNS:
        value = values[name]
        if value is not None:
            content[name] = utc_text(value) if isinstance(value, datetime) else value
    return sha256_hex(canonical_json(content))


def link(previous: str, row: str) -> str:
    """The chain's digest after a row of digest `row` follows the link `previous`."""
    return hashlib.sha256(bytes.fromhex(previous) + bytes.fromhex(row)).hexdigest()


@dataclass(frozen=True)
class Head:
    """The chain's last row: how many rows it holds and its digest (`GENESIS` when empty)."""

    rows: int = 0
    digest: str = GENESIS


HEAD_FUNCTION = "medtpe_chain_head"
"""PostgreSQL's function (migration 0003) that takes the chain's lock and then reads its head, in
one statement: its query runs after the lock is granted, on a snapshot of its own (a volatile
function's), so it sees the rows the previous holder committed."""


def lock_chain(connection: Connection) -> Head:
    """Take the chain's lock in `connection`'s transaction (held to its commit or rollback; the
    transaction must not have run a statement yet) and read its head."""
    if connection.dialect.name == "postgresql":
        found = connection.execute(
            text(f"SELECT seq, digest FROM {HEAD_FUNCTION}(:key)"), {"key": CHAIN_LOCK_KEY}
        ).one()
        return Head() if found[0] is None else Head(found[0], found[1])
    connection.exec_driver_sql("BEGIN IMMEDIATE")  # SQLite's write lock (WAL: readers go on)
    return read_head(connection)


LINK_FUNCTION = "medtpe_chain_link"
"""SQLite's function `link` (registered on every connection of the ledger's engine)."""
SQLITE_APPEND = text(
    f"INSERT INTO predictions ({', '.join(CHAINED_COLUMNS)}, chain_seq, chain_digest) "
    f"SELECT {', '.join(':' + name for name in CHAINED_COLUMNS)}, "
    f"coalesce(last.chain_seq, 0) + 1, {LINK_FUNCTION}(coalesce(last.chain_digest, :genesis), "
    ":row) FROM (SELECT 1) AS one LEFT JOIN (SELECT chain_seq, chain_digest FROM predictions "
    "WHERE chain_seq IS NOT NULL ORDER BY chain_seq DESC LIMIT 1) AS last ON 1 "
    "RETURNING chain_seq, chain_digest"
).bindparams(*(bindparam(name, type_=_PREDICTIONS.c[name].type) for name in CHAINED_COLUMNS))
"""SQLite: one row appended after the chain's head in one statement (parameters: the row's
columns, `genesis` and `row`, its `row_digest`), its place and link returned."""


def read_head(connection: Connection) -> Head:
    """The chain's last row (by the unique index on `chain_seq`)."""
    seq = _PREDICTIONS.c.chain_seq
    last = connection.execute(
        select(seq, _PREDICTIONS.c.chain_digest)
        .where(seq.is_not(None))
        .order_by(seq.desc())
        .limit(1)
    ).first()
    return Head() if last is None else Head(last[0], last[1])


def chained(rows: Sequence[dict[str, Any]], head: Head) -> tuple[list[dict[str, Any]], Head]:
    """`rows` (column values) with their places after `head` and their links, and the new
    head."""
    out, digest = [], head.digest
    for offset, values in enumerate(rows, start=1):
        digest = link(digest, row_digest(values))
        out.append(values | {"chain_seq": head.rows + offset, "chain_digest": digest})
    return out, Head(head.rows + len(rows), digest)


@dataclass(frozen=True)
class Checkpoint:
    """The chain's head at `rows` rows, signed with the ledger's key (`key_id`) at
    `created_at` (UTC ISO 8601): what `medtpe ledger checkpoint` prints as one JSON line."""

    rows: int
    digest: str
    created_at: str
    key_id: str
    signature: str

    @staticmethod
    def signed_bytes(rows: int, digest: str, created_at: str) -> bytes:
        """What a checkpoint's signature covers: the canonical JSON of its version, row count,
        digest and time."""
        return canonical_json(
            {
                "chain_version": CHAIN_VERSION,
                "created_at": created_at,
                "digest": digest,
                "rows": rows,
            }
        )

    @classmethod
    def sign(cls, head: Head, signer: Signer, when: datetime | None = None) -> Checkpoint:
        """The checkpoint of `head`, signed by `signer` now (or at `when`)."""
        created_at = utc_text(when or datetime.now(UTC))
        data = cls.signed_bytes(head.rows, head.digest, created_at)
        return cls(head.rows, head.digest, created_at, signer.key_id, signer.sign_bytes(data))

    def verifies(self, public_key: Any) -> bool:
        """Whether the signature is `public_key`'s over this checkpoint's signed bytes."""
        data = self.signed_bytes(self.rows, self.digest, self.created_at)
        return verify_bytes(data, self.signature, public_key)

    def to_line(self) -> str:
        """The checkpoint as one line of compact JSON (keys sorted)."""
        return canonical_json(asdict(self)).decode()

    @classmethod
    def from_line(cls, line: str) -> Checkpoint:
        """A checkpoint from its JSON line; a ValueError saying what is wrong."""
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg})") from exc
        names = ("rows", "digest", "created_at", "key_id", "signature")
        if not isinstance(data, dict) or sorted(data) != sorted(names):
            raise ValueError(f"expected a JSON object of {', '.join(names)}")
        if type(data["rows"]) is not int or data["rows"] < 0:
            raise ValueError("rows: expected a row count")
        if not all(isinstance(data[name], str) for name in names[1:]):
            raise ValueError("digest, created_at, key_id and signature: expected texts")
        return cls(**data)

    def values(self) -> dict[str, Any]:
        """The checkpoint's column values (its time naive UTC, as the ledger stores times)."""
        when = datetime.fromisoformat(self.created_at.removesuffix("Z"))
        return asdict(self) | {"created_at": when}

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Checkpoint:
        """A checkpoint from its stored columns."""
        return cls(
            rows=values["rows"],
            digest=values["digest"],
            created_at=utc_text(values["created_at"]),
            key_id=values["key_id"],
            signature=values["signature"],
        )


def record_checkpoints(connection: Connection, checkpoints: Sequence[Checkpoint]) -> None:
    """Store `checkpoints` (one already stored at the same row count is kept)."""
    if not checkpoints:
        return
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    insert = dialect.insert(_CHECKPOINTS).on_conflict_do_nothing(index_elements=["rows"])
    connection.execute(insert, [checkpoint.values() for checkpoint in checkpoints])


def stored_checkpoints(connection: Connection) -> list[Checkpoint]:
    """The checkpoints the ledger keeps, by row count."""
    found = connection.execute(select(_CHECKPOINTS).order_by(_CHECKPOINTS.c.rows)).mappings()
    return [Checkpoint.from_values(values) for values in found]


def checkpoint_now(connection: Connection, signer: Signer) -> Checkpoint:
    """Sign and store the chain's head now, under the chain's lock (`connection` in a new
    transaction); the checkpoint already stored at this row count when there is one."""
    head = lock_chain(connection)
    record_checkpoints(connection, [Checkpoint.sign(head, signer)])
    found = connection.execute(select(_CHECKPOINTS).where(_CHECKPOINTS.c.rows == head.rows))
    return Checkpoint.from_values(found.mappings().one())


def due_checkpoints(
    appended: Sequence[Mapping[str, Any]], every: int, signer: Callable[[], Signer]
) -> Iterator[Checkpoint]:
    """The checkpoints of the appended rows whose place is a multiple of `every` (0: none)."""
    for values in appended:
        if every and values["chain_seq"] % every == 0:
            head = Head(values["chain_seq"], values["chain_digest"])
            yield Checkpoint.sign(head, signer())
