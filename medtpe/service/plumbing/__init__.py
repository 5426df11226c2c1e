"""What the service's doors share: API errors and their one JSON body (`errors`), request bodies
decoded in one pass (`json_body`), admission and the body's size and time caps (`limits`), the
Prometheus metrics (`metrics`), the path every predicting route answers through (`serving`), the
ledger's rows and the receipts they carry (`ledger_writes`, `receipts`), the live fidelity
shadow (`shadow`), one process's state (`state`) and per-caller cache salts (`tenancy`)."""

__all__ = [
    "errors",
    "json_body",
    "ledger_writes",
    "limits",
    "metrics",
    "receipts",
    "serving",
    "shadow",
    "state",
    "tenancy",
]
