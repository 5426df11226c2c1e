"""The compression page's door: the static page at `/ui/`.

Its `routes.attach(app)` serves it; `medtpe.service.app` attaches every door."""

__all__ = ["routes"]
