"""The prediction API: `/predict`, `/predict/batch` and `/tokenize` (its routes, request and
response models, response builders). The CDS Hooks door is its sibling, `service.cds_hooks`;
what both doors share lives at `service`'s top level."""
