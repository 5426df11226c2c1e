"""The prediction door: `/predict`, `/predict/batch` and `/tokenize` (its routes, request and
response models, response builders).

Its `routes.attach(app)` serves it; `medtpe.service.app` attaches every door. Its request models
(`schemas`) give the other doors the API key schemes, and its task choice (`task_choice`) the
task names."""

__all__ = ["routes", "schemas", "task_choice"]
