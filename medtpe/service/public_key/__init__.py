"""The ledger's door: `GET /ledger/public-key`, the key that checks every receipt.

Its `routes.attach(app)` serves it; `medtpe.service.app` attaches every door."""

__all__ = ["routes"]
