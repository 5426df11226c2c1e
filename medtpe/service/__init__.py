"""The HTTP service. Each door is a package: `medtpe.service.predict` (`/predict`, `/predict/batch`,
`/tokenize`) and `medtpe.service.cds_hooks` (`/cds-services`). The top-level modules are what the
doors share: the app (`app`), settings, metrics, admission (`limits`), draining, errors, body
decoding (`json_body`), probes, `serving` (the prediction path both doors answer through), the
ledger and its receipts, the model card route, the UI and the API docs.

Two kinds of state, not to be confused:
- `medtpe.service.plumbing.state` (`ServiceState`): one process's own state (the engine, the model,
  its metrics).
- `medtpe.service.cds_hooks.state_store`: the store every API process and replica shares
  (`MEDTPE_STATE_URL`: replayed JWT ids, the score cache, the cards issued).
"""
