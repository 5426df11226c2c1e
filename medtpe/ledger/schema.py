"""The ledger's tables (SQLAlchemy 2 typed declarative); `medtpe/ledger/migrations` creates and
changes them: a change here goes with a new migration under `medtpe/ledger/migrations/versions`.

`predictions`: one row per answer, each in the hash chain (`medtpe.ledger.chain`: its place and
digest); `chain_checkpoints`: the chain's head signed at a row count; `feedback`: what an EHR said
of a CDS card (accepted, overridden). Times are UTC (naive in SQLite, `timestamptz` in
PostgreSQL)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

DOORS = ("predict", "predict_batch", "cds_hook", "batch_meds", "batch_fhir")
"""Where a prediction came in: `/predict`, `/predict/batch`, a CDS hook, `medtpe predict` on
MEDS or on FHIR input."""


class Base(DeclarativeBase):
    """The ledger's tables."""


class Prediction(Base):
    """One answer: who asked through which door, about whom, what was answered, its receipt."""

    __tablename__ = "predictions"

    prediction_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    door: Mapped[str] = mapped_column(String(16))
    caller: Mapped[str] = mapped_column(String(200))
    site: Mapped[str | None] = mapped_column(String(200))
    task: Mapped[str] = mapped_column(String(100))
    subject_id: Mapped[str] = mapped_column(String(200))
    prediction_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    answer: Mapped[str] = mapped_column(Text)
    p_yes: Mapped[float | None] = mapped_column(Float)
    format_ok: Mapped[bool] = mapped_column(Boolean)
    original_tokens: Mapped[int] = mapped_column(Integer)
    medtpe_tokens: Mapped[int] = mapped_column(Integer)
    compression_rate: Mapped[float] = mapped_column(Float)
    latency_ms: Mapped[float] = mapped_column(Float)
    mode: Mapped[str] = mapped_column(String(16))
    silent: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    shadow_of: Mapped[str | None] = mapped_column(String(36))
    receipt: Mapped[str] = mapped_column(Text)
    signature: Mapped[str] = mapped_column(String(200))
    key_id: Mapped[str] = mapped_column(String(100))
    record: Mapped[str | None] = mapped_column(Text)
    chain_seq: Mapped[int | None] = mapped_column(BigInteger)
    """The row's place in the hash chain (1, 2, 3 …; given under the chain's lock as it is
    appended); empty only for a row written past the ledger's writer."""
    chain_digest: Mapped[str | None] = mapped_column(String(64))
    """The chain's digest with this row (`medtpe.ledger.chain.link`)."""

    __table_args__ = (
        Index("ix_predictions_task_created_at", "task", "created_at"),
        Index("ix_predictions_subject_id", "subject_id"),
        Index("ix_predictions_site_created_at", "site", "created_at"),
        Index("ix_predictions_chain_seq", "chain_seq", unique=True),
    )


class ChainCheckpoint(Base):
    """The hash chain's head at a row count, signed with the ledger's key
    (`medtpe.ledger.chain.Checkpoint`)."""

    __tablename__ = "chain_checkpoints"

    rows: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    digest: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    key_id: Mapped[str] = mapped_column(String(100))
    signature: Mapped[str] = mapped_column(String(200))


class Feedback(Base):
    """An EHR's feedback on a CDS card (`POST /cds-services/{id}/feedback`)."""

    __tablename__ = "feedback"

    card_uuid: Mapped[str] = mapped_column(String(36), primary_key=True)
    prediction_id: Mapped[str] = mapped_column(ForeignKey("predictions.prediction_id"), index=True)
    issuer: Mapped[str] = mapped_column(String(500))
    outcome: Mapped[str] = mapped_column(String(32))
    override_reason: Mapped[str | None] = mapped_column(Text)
    outcome_time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


OUTCOME_STATUSES = ("known", "open", "no_label")
"""An outcome row's state: `known` (the task's horizon has passed in the data: `label` holds what
happened), `open` (not yet: joined again later), `no_label` (the horizon has passed but the
task's definition gives no label at that prediction time, e.g. a stay too short)."""


class Outcome(Base):
    """What happened after a prediction, by the task's own labeller (`medtpe outcomes`)."""

    __tablename__ = "outcomes"

    prediction_id: Mapped[str] = mapped_column(
        ForeignKey("predictions.prediction_id"), primary_key=True
    )
    status: Mapped[str] = mapped_column(String(16))
    label: Mapped[bool | None] = mapped_column(Boolean)
    horizon_end: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """When the outcome is known: the prediction time plus the task's horizon (None: not yet
    known when the horizon is an event, such as an ICU discharge still to come)."""
    data_end: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """The last event time of the dataset the outcome was read from."""
    source: Mapped[str] = mapped_column(String(500))
    joined_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Attribute(Base):
    """One cohort attribute of a prediction (sex, age band, a site-mapped attribute), read from
    the record at its prediction time (`medtpe outcomes`)."""

    __tablename__ = "attributes"

    prediction_id: Mapped[str] = mapped_column(
        ForeignKey("predictions.prediction_id"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[str] = mapped_column(String(200))
