"""The HTTP service: the FastAPI app (`app`), its settings from the environment (`settings`; the
CDS Hooks' and the shared state's in `cds_settings`), several API processes on one engine
(`api_processes`) and the drain before it stops (`drain`). Each door is a package whose
`routes.attach(app)` serves it: `predict` (`/predict`, `/predict/batch`, `/tokenize`),
`cds_hooks` (`/cds-services`), `public_key`, `model_card`, `page` (`/ui/`), `probes`
(`/healthz`, `/readyz`, `/metrics`) and `api_docs`; what the doors share is in `plumbing`.

Two kinds of state, not to be confused:
- `medtpe.service.plumbing.state` (`ServiceState`): one process's own state (the engine, the model,
  its metrics).
- `medtpe.service.cds_hooks.state_store`: the store every API process and replica shares
  (`MEDTPE_STATE_URL`: replayed JWT ids, the score cache, the cards issued).
"""

__all__ = ["api_processes", "app", "cds_settings", "drain", "settings"]
