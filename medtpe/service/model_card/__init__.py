"""The model card's door: `GET /model-card` (JSON) and `GET /model-card.xml` (CHAI).

Its `routes.attach(app)` serves it; `medtpe.service.app` attaches every door."""

__all__ = ["routes"]
