"""The FHIR input's defaults, in a module light enough for the command line to import."""

DEFAULT_BUCKET_MIB = 256
"""Resources per bucket of the export's grouping: it holds one bucket in memory (about 1.5x)."""
DEFAULT_SCOPE = "system/*.rs"
"""SMART Backend Services scope: read and search every resource type (SMART 2 scopes)."""
