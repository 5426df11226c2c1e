"""The ledger's schema revisions, oldest first, loaded by Alembic by path; no module imports
them."""

__all__: list[str] = []
