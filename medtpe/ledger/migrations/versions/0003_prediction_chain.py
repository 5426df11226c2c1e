"""The predictions' hash chain: each row's place and digest, and the signed checkpoints; the rows
already there chained in the order the ledger reads them (time, then id).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from medtpe.ledger.chain import CHAINED_COLUMNS, GENESIS, HEAD_FUNCTION, link, row_digest

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

PAGE_ROWS = 1_000
"""Rows read and chained per statement."""
_TYPES = {
    "created_at": sa.DateTime(timezone=True),
    "prediction_time": sa.DateTime(timezone=True),
    "p_yes": sa.Float(),
    "format_ok": sa.Boolean(),
    "original_tokens": sa.Integer(),
    "medtpe_tokens": sa.Integer(),
    "compression_rate": sa.Float(),
    "latency_ms": sa.Float(),
    "silent": sa.Boolean(),
}
"""The columns read as other than text (times, numbers, booleans), as revision 0001 made them."""


def upgrade() -> None:
    """Add `chain_seq` and `chain_digest` to `predictions`, create `chain_checkpoints`, chain
    the rows already there, then index `chain_seq` (unique); on PostgreSQL, create the function
    that locks the chain and reads its head."""
    op.add_column("predictions", sa.Column("chain_seq", sa.BigInteger, nullable=True))
    op.add_column("predictions", sa.Column("chain_digest", sa.String(64), nullable=True))
    op.create_table(
        "chain_checkpoints",
        sa.Column("rows", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("key_id", sa.String(100), nullable=False),
        sa.Column("signature", sa.String(200), nullable=False),
    )
    _chain_rows(op.get_bind())
    op.create_index("ix_predictions_chain_seq", "predictions", ["chain_seq"], unique=True)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_HEAD_FUNCTION)


_HEAD_FUNCTION = f"""
CREATE FUNCTION {HEAD_FUNCTION}(lock_key bigint, OUT seq bigint, OUT digest text)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
    SELECT chain_seq, chain_digest INTO seq, digest FROM predictions
     WHERE chain_seq IS NOT NULL ORDER BY chain_seq DESC LIMIT 1;
END
$$
"""
"""PostgreSQL: the chain's lock, then its head read on a snapshot taken after the lock was
granted (`medtpe.ledger.chain.lock_chain`)."""


def _chain_rows(connection: sa.Connection) -> None:
    """Give every row its place and digest, oldest first (`created_at`, then `prediction_id`),
    a page of `PAGE_ROWS` at a time."""
    table = sa.table(
        "predictions",
        *(sa.column(name, _TYPES.get(name, sa.Text())) for name in CHAINED_COLUMNS),
        sa.column("chain_seq", sa.BigInteger()),
        sa.column("chain_digest", sa.String()),
    )
    order = (table.c.created_at, table.c.prediction_id)
    update = (
        table.update()
        .where(table.c.prediction_id == sa.bindparam("id"))
        .values(chain_seq=sa.bindparam("seq"), chain_digest=sa.bindparam("digest"))
    )
    seq, digest, after = 0, GENESIS, None
    while True:
        query = sa.select(*(table.c[name] for name in CHAINED_COLUMNS)).order_by(*order)
        if after is not None:
            query = query.where(sa.tuple_(*order) > sa.tuple_(*after))
        page = connection.execute(query.limit(PAGE_ROWS)).mappings().all()
        if not page:
            return
        links = []
        for values in page:
            seq, digest = seq + 1, link(digest, row_digest(values))
            links.append({"id": values["prediction_id"], "seq": seq, "digest": digest})
        connection.execute(update, links)
        after = (page[-1]["created_at"], page[-1]["prediction_id"])


def downgrade() -> None:
    """Drop the function, the index, the checkpoints and the two columns."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION {HEAD_FUNCTION}(bigint)")
    op.drop_index("ix_predictions_chain_seq", "predictions")
    op.drop_table("chain_checkpoints")
    with op.batch_alter_table("predictions") as batch:
        batch.drop_column("chain_digest")
        batch.drop_column("chain_seq")
