"""The FHIR input's defaults, in a module light enough for the command line to import."""

DEFAULT_BUCKET_MIB = 256
"""NDJSON per bucket of the export's grouping: a bucket is one output shard (the unit the job
resumes at and Ray spreads); its index is held while it is scored (16 bytes a run of rows)."""
DEFAULT_SCOPE = "system/*.rs"
"""SMART Backend Services scope: read and search every resource type (SMART 2 scopes)."""
