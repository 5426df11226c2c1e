"""The predictions and feedback tables.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create `predictions` (with its three indexes) and `feedback`."""
    when = sa.DateTime(timezone=True)
    op.create_table(
        "predictions",
        sa.Column("prediction_id", sa.String(36), primary_key=True),
        sa.Column("created_at", when, nullable=False),
        sa.Column("door", sa.String(16), nullable=False),
        sa.Column("caller", sa.String(200), nullable=False),
        sa.Column("site", sa.String(200), nullable=True),
        sa.Column("task", sa.String(100), nullable=False),
        sa.Column("subject_id", sa.String(200), nullable=False),
        sa.Column("prediction_time", when, nullable=True),
        sa.Column("answer", sa.Text, nullable=False),
        sa.Column("p_yes", sa.Float, nullable=True),
        sa.Column("format_ok", sa.Boolean, nullable=False),
        sa.Column("original_tokens", sa.Integer, nullable=False),
        sa.Column("medtpe_tokens", sa.Integer, nullable=False),
        sa.Column("compression_rate", sa.Float, nullable=False),
        sa.Column("latency_ms", sa.Float, nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("silent", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("shadow_of", sa.String(36), nullable=True),
        sa.Column("receipt", sa.Text, nullable=False),
        sa.Column("signature", sa.String(200), nullable=False),
        sa.Column("key_id", sa.String(100), nullable=False),
        sa.Column("record", sa.Text, nullable=True),
    )
    op.create_index("ix_predictions_task_created_at", "predictions", ["task", "created_at"])
    op.create_index("ix_predictions_subject_id", "predictions", ["subject_id"])
    op.create_index("ix_predictions_site_created_at", "predictions", ["site", "created_at"])
    op.create_table(
        "feedback",
        sa.Column("card_uuid", sa.String(36), primary_key=True),
        sa.Column(
            "prediction_id",
            sa.String(36),
            sa.ForeignKey("predictions.prediction_id"),
            nullable=False,
        ),
        sa.Column("issuer", sa.String(500), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("override_reason", sa.Text, nullable=True),
        sa.Column("outcome_time", when, nullable=False),
        sa.Column("received_at", when, nullable=False),
    )
    op.create_index("ix_feedback_prediction_id", "feedback", ["prediction_id"])


def downgrade() -> None:
    """Drop both tables."""
    op.drop_table("feedback")
    op.drop_table("predictions")
