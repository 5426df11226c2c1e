"""Alembic's environment for the ledger: run programmatically (`medtpe.ledger.migrate.upgrade`), on
the connection it is handed in `config.attributes["connection"]`."""

from __future__ import annotations

from alembic import context

from medtpe.ledger.schema import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
