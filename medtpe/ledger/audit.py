"""`medtpe ledger audit`'s check of the whole ledger: the hash chain (`medtpe.ledger.chain`) walked
row by row in its order, each row's signature and signed columns (`check_row`), and the signed
checkpoints, the ledger's own and those kept elsewhere. The first finding is named in one line:

- `gap`: places missing in the chain (rows deleted);
- `insertion`: a row with no place in the chain, or a place where none was chained;
- `reordering`: a row chained after a row that now comes after it;
- `edit`: a row that is not what was chained, or that its receipt does not sign;
- `rewrite`: a chain that differs from a signed checkpoint (rows changed and the chain
  recomputed), `rollback`: a checkpoint past the chain's end (its last rows deleted), `forged
  checkpoint`: a checkpoint not signed by the key.

A ledger whose oldest rows were deleted (retention) is walked from the first row kept, which the
audit's line names; the checkpoints before it are not checked. Rows are read streamed; the walk
ends within its deadline (`AuditIncomplete`); a database that cannot be read is a
`LedgerUnavailable`."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import SQLAlchemyError

from medtpe.ledger.chain import GENESIS, Checkpoint, Head, link, row_digest, stored_checkpoints
from medtpe.ledger.schema import Prediction
from medtpe.ledger.store import (
    CHUNK_ROWS,
    LedgerUnavailable,
    PredictionRow,
    database_reason,
    stored_row,
)
from medtpe.ledger.verification import Check, check_row

LEDGER_SOURCE = "the ledger"
"""How the checkpoints the ledger keeps are named."""
_TABLE = Prediction.__table__
_SEQ, _DIGEST, _ID = _TABLE.c.chain_seq, _TABLE.c.chain_digest, _TABLE.c.prediction_id
_CONTENT = [_TABLE.c[name] for name in PredictionRow.__dataclass_fields__]


class AuditIncomplete(RuntimeError):
    """The audit's deadline passed before it ended."""


@dataclass(frozen=True)
class Audit:
    """What the audit found: the rows it walked, its first finding (None: chain intact) and the
    last checkpoint it checked, with where it was kept."""

    rows: int
    finding: str | None
    last_checkpoint: tuple[Checkpoint, tuple[str, ...]] | None
    first: int = 1
    """The chain's first row kept (the rows before it deleted by retention)."""

    def line(self) -> str:
        """The audit's one line of output."""
        if self.finding is not None:
            return self.finding
        if self.last_checkpoint is None:
            last = "no checkpoint"
        else:
            checkpoint, sources = self.last_checkpoint
            last = (
                f"last checkpoint at row {checkpoint.rows} signed {checkpoint.created_at} "
                f"({', '.join(sources)})"
            )
        if self.first > 1:
            kept = f"rows {self.first}–{self.first + self.rows - 1} (those before deleted)"
            return f"{self.rows} rows, chain intact over {kept}, {last}"
        return f"{self.rows} rows, chain intact, {last}"


@dataclass
class _Walk:
    """The state of one audit: its connection, key, checkpoints by row count and deadline."""

    connection: Connection
    public_key: Ed25519PublicKey
    checkpoints: dict[int, list[tuple[str, Checkpoint]]]
    deadline: float
    head: Head = field(default_factory=Head)
    first: int = 1

    def in_time(self) -> None:
        """An `AuditIncomplete` once the deadline has passed."""
        if time.monotonic() > self.deadline:
            raise AuditIncomplete(
                f"audit incomplete: its deadline passed after {self.head.rows} rows"
            )


def audit(
    engine: Engine,
    public_key: Ed25519PublicKey,
    kept: Sequence[tuple[str, Checkpoint]] = (),
    *,
    deadline_s: float,
) -> Audit:
    """Audit the ledger of `engine` with the signing key's `public_key`, against its own
    checkpoints and those `kept` elsewhere (`(source, checkpoint)`), within `deadline_s`
    seconds (`AuditIncomplete`)."""
    deadline = time.monotonic() + deadline_s
    try:
        with engine.connect() as connection:
            own = [(LEDGER_SOURCE, checkpoint) for checkpoint in stored_checkpoints(connection)]
            walk = _Walk(connection, public_key, {}, deadline)
            for source, checkpoint in [*own, *kept]:
                if not checkpoint.verifies(public_key):
                    return Audit(0, _forged(source, checkpoint), None)
                walk.checkpoints.setdefault(checkpoint.rows, []).append((source, checkpoint))
            finding = _unchained(connection) or _at(walk) or _walk(walk) or _past_end(walk)
    except SQLAlchemyError as exc:
        raise LedgerUnavailable(f"the ledger cannot be read: {database_reason(exc)}") from exc
    walked = walk.head.rows - walk.first + 1 if walk.head.rows else 0
    return Audit(walked, finding, _last(walk), walk.first)


def _forged(source: str, checkpoint: Checkpoint) -> str:
    return (
        f"forged checkpoint: the checkpoint at row {checkpoint.rows} signed "
        f"{checkpoint.created_at} ({source}) is not signed by the ledger's key"
    )


def _unchained(connection: Connection) -> str | None:
    """A row without a place in the chain (written past the ledger's writer)."""
    count = connection.execute(
        select(func.count()).select_from(_TABLE).where(_SEQ.is_(None))
    ).scalar_one()
    if not count:
        return None
    first = connection.execute(
        select(_ID).where(_SEQ.is_(None)).order_by(_TABLE.c.created_at).limit(1)
    ).scalar_one()
    return (
        f"insertion: prediction {first} has no place in the chain ({count} such rows): written "
        "past the ledger's writer"
    )


def _rows(connection: Connection, columns: Sequence[Any]) -> Iterator[Mapping[str, Any]]:
    """The chained rows' `columns`, in the chain's order, streamed."""
    query = select(*columns).where(_SEQ.is_not(None)).order_by(_SEQ)
    result = connection.execution_options(yield_per=CHUNK_ROWS).execute(query)
    yield from result.mappings()


def _walk(walk: _Walk) -> str | None:
    """Follow the chain from its first row: the first finding, else None."""
    rows = _rows(walk.connection, [*_CONTENT, _SEQ, _DIGEST])
    for values in rows:
        walk.in_time()
        seq, stored, row_id = values["chain_seq"], values["chain_digest"], values["prediction_id"]
        if walk.head.rows == 0 and seq > 1:  # the oldest rows deleted: start at the first kept
            walk.first, walk.head = seq, Head(seq - 1, "")
        if seq != walk.head.rows + 1:
            return (
                f"gap: {_places(walk.head.rows + 1, seq - 1)} of the chain missing before "
                f"prediction {row_id} (row {seq}): deleted"
            )
        digest = row_digest(values)
        if seq != walk.first and link(walk.head.digest, digest) != stored:
            return _broken(walk, values, digest, next(rows, None))
        failed = _unsigned(walk, values)
        if failed:
            return _forged_row(walk, values, failed[0], next(rows, None))
        walk.head = Head(seq, stored)
        finding = _at(walk)
        if finding:
            return finding
    return None


def _forged_row(
    walk: _Walk, values: Mapping[str, Any], failed: Check, after: Mapping[str, Any] | None
) -> str:
    """Name a row chained in its place but not signed as it is (`failed`): inserted when the
    row `after` it is chained to the row before it, else edited; either way with its link
    recomputed."""
    seq, row_id = values["chain_seq"], values["prediction_id"]
    if _follows_head(walk, after):
        return (
            f"insertion: prediction {row_id} (row {seq}) was not chained there: "
            f"{failed.detail}, and the row after it is chained to the row before it"
        )
    return f"edit: prediction {row_id} (row {seq}): {failed.detail}; its link was recomputed"


def _follows_head(walk: _Walk, after: Mapping[str, Any] | None) -> bool:
    """Whether the row `after` (None: none) is chained to the walk's head."""
    return after is not None and link(walk.head.digest, row_digest(after)) == after["chain_digest"]


def _unsigned(walk: _Walk, values: Mapping[str, Any]) -> list[Check]:
    """The checks of the row's signature and signed columns (`check_row`) that fail."""
    row = stored_row({name: values[name] for name in PredictionRow.__dataclass_fields__})
    return [check for check in check_row(row, walk.public_key)[1] if not check.ok]


def _at(walk: _Walk) -> str | None:
    """Whether the chain's head agrees with the checkpoints signed at its row count."""
    for source, checkpoint in walk.checkpoints.get(walk.head.rows, []):
        if checkpoint.digest != walk.head.digest:
            return (
                f"rewrite: the chain at row {walk.head.rows} is not the one signed "
                f"{checkpoint.created_at} ({source}): rows up to it were changed, deleted or "
                "inserted and the chain recomputed"
            )
    return None


def _broken(
    walk: _Walk, values: Mapping[str, Any], digest: str, after: Mapping[str, Any] | None
) -> str:
    """Name what broke the chain at the row of `values` (its content's `digest`), the row
    `after` it (None: the last) helping to tell an insertion from an edit."""
    seq, row_id = values["chain_seq"], values["prediction_id"]
    chained_after = _predecessor(walk, digest, values["chain_digest"])
    if chained_after is not None:
        row, before_id = chained_after
        if row >= seq:
            return (
                f"reordering: prediction {row_id} (row {seq}) was chained after prediction "
                f"{before_id}, which now comes after it (row {row})"
            )
        return (
            f"insertion: {_places(row + 1, seq - 1)} not chained there: prediction {row_id} "
            f"(row {seq}) is chained to row {row}"
        )
    if _follows_head(walk, after):
        return (
            f"insertion: prediction {row_id} (row {seq}) was not chained there: the row after "
            "it is chained to the row before it"
        )
    failed = _unsigned(walk, values)
    if failed:
        return f"edit: prediction {row_id} (row {seq}): {failed[0].detail}"
    return (
        f"edit: prediction {row_id} (row {seq}) is not what was chained there: a column its "
        "receipt does not sign was edited, or the row before it deleted and the rows renumbered"
    )


def _places(first: int, last: int) -> str:
    """`row 5`, or `rows 5–7`."""
    return f"row {first}" if first == last else f"rows {first}–{last}"


def _predecessor(walk: _Walk, digest: str, stored: str) -> tuple[int, str] | None:
    """The row (its place and prediction id) the chain's link `stored` of a row of content
    `digest` was made after (place 0: the chain's start), searched in a second pass."""
    if link(GENESIS, digest) == stored:
        return 0, "(the chain's start)"
    for values in _rows(walk.connection, [_SEQ, _DIGEST, _ID]):
        walk.in_time()
        if link(values["chain_digest"], digest) == stored:
            return values["chain_seq"], values["prediction_id"]
    return None


def _past_end(walk: _Walk) -> str | None:
    """A checkpoint past the chain's last row."""
    beyond = [(rows, found) for rows, found in walk.checkpoints.items() if rows > walk.head.rows]
    if not beyond:
        return None
    rows, [(source, checkpoint), *_] = max(beyond)
    return (
        f"rollback: the chain ends at row {walk.head.rows} but a checkpoint signed "
        f"{checkpoint.created_at} ({source}) covers {rows} rows: its last rows were deleted, or "
        "the ledger restored from an older copy"
    )


def _last(walk: _Walk) -> tuple[Checkpoint, tuple[str, ...]] | None:
    """The last checkpoint within the chain, with where it was kept."""
    within = [rows for rows in walk.checkpoints if walk.first <= rows <= walk.head.rows]
    if not within:
        return None
    found = walk.checkpoints[max(within)]
    return found[0][1], tuple(dict.fromkeys(source for source, _ in found))
