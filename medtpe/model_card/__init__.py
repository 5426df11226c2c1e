"""The model card, generated from what the served model is made of (`card`), and the same card as
CHAI's Applied Model Card XML (`xml`); the service serves both, the FHIR resources written back
carry its digest."""

__all__ = ["card", "xml"]
