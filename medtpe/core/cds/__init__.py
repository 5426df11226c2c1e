"""CDS Hooks 2.0 logic without HTTP: the services offered (hook, task, prefetch templates), risk
bands, the card's text and the score cache. The HTTP side (routes, JWT, FHIR client) is
`medtpe/service/cds_hooks/`."""

__all__ = ["cards", "risk", "score_cache", "services"]
