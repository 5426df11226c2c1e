"""The orchestrators' door: `/healthz`, `/readyz` and `/metrics`.

Its `routes.attach(app)` serves it; `medtpe.service.app` attaches every door."""

__all__ = ["routes"]
