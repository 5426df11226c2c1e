"""The API's description: `/openapi.json`, `/docs` and `/redoc`.

Its `routes.attach(app)` serves it; `medtpe.service.app` attaches every door."""

__all__ = ["routes"]
