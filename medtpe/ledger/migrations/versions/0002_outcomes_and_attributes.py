"""The outcomes and attributes tables (what happened after a prediction, its cohort).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _prediction() -> sa.ForeignKey:
    return sa.ForeignKey("predictions.prediction_id")


def upgrade() -> None:
    """Create `outcomes` (one per prediction) and `attributes` (name/value per prediction)."""
    when = sa.DateTime(timezone=True)
    op.create_table(
        "outcomes",
        sa.Column("prediction_id", sa.String(36), _prediction(), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("label", sa.Boolean, nullable=True),
        sa.Column("horizon_end", when, nullable=True),
        sa.Column("data_end", when, nullable=True),
        sa.Column("source", sa.String(500), nullable=False),
        sa.Column("joined_at", when, nullable=False),
    )
    op.create_table(
        "attributes",
        sa.Column("prediction_id", sa.String(36), _prediction(), primary_key=True),
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("value", sa.String(200), nullable=False),
    )


def downgrade() -> None:
    """Drop both tables."""
    op.drop_table("attributes")
    op.drop_table("outcomes")
