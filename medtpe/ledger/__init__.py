"""The prediction ledger: every answer as one row with its signed receipt (`medtpe.ledger.store`,
`medtpe.ledger.receipt`, `medtpe.ledger.signing`), the model card and the FHIR resources written
back.

It imports the core (`medtpe_core`) and the database and crypto libraries only: the service, the
batch job and the command line write to it; it knows nothing of them."""
