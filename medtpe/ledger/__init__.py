"""The prediction ledger: every answer as one row (`schema`, `store`) built from its facts
(`answers`) with its receipt (`receipt`) signed by the ledger's key (`signing`), appended to a
hash chain with signed checkpoints (`chain`) that `audit` checks whole; the EHR's
feedback on cards (`feedback`); what happened after the predictions (`outcomes`); a row checked
against its receipt and re-derived (`verification`); its settings (`settings`) and schema
migrations (`migrate`, running Alembic's `migrations`).

It imports the core (`medtpe.core`) and the database and crypto libraries only: the service, the
batch job and the command line write to it; it knows nothing of them."""

__all__ = [
    "answers",
    "audit",
    "chain",
    "feedback",
    "migrate",
    "outcomes",
    "receipt",
    "schema",
    "settings",
    "signing",
    "store",
    "verification",
]
