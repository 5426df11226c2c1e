"""Fixtures of the monitoring tests: the ledger tests' own (`ledger_url`: an empty ledger on
SQLite or on a real PostgreSQL server started for the session)."""

from __future__ import annotations

from tests.ledger.conftest import ledger_url, postgres_server

__all__ = ["ledger_url", "postgres_server"]
