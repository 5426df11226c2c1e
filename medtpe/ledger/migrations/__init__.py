"""The ledger's Alembic migrations (a package, so it ships with `ledger`): Alembic runs `env.py`
and the revisions by path (`medtpe.ledger.migrate`); no module imports them."""

__all__: list[str] = []
