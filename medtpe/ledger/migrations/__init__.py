"""The ledger's Alembic migrations (a package, so it ships with `ledger`)."""
