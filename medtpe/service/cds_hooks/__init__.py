"""The CDS Hooks 2.0 HTTP service: discovery, hook calls and feedback under `/cds-services`,
each call authenticated by the EHR's JWT (not the API keys of `/predict`). Pure logic (services,
risk bands, card text, score cache) lives in `medtpe/core/cds/`; docs/integration.md says how a
hospital connects.

Its `routes.attach(app)` serves it; `medtpe.service.app` attaches every door. The service's
settings read the EHR issuers' JWT settings (`jwt_auth`) and the shared store's URL schemes
(`state_store`)."""

__all__ = ["jwt_auth", "routes", "state_store"]
