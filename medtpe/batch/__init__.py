"""The population batch job (`medtpe predict`) and its inputs: a MEDS dataset scored shard by
shard in this process (`job`) or on Ray (`ray_job`); a FHIR Bulk Data export downloaded
(`bulk_client`, over `fhir_http`), read one patient at a time (`fhir_export`) and scored
(`fhir_job`); the predictions written back to the EHR's FHIR server (`write_back`); the FHIR
input's defaults, light enough for the command line to import (`defaults`)."""

__all__ = [
    "bulk_client",
    "defaults",
    "fhir_export",
    "fhir_http",
    "fhir_job",
    "job",
    "ray_job",
    "write_back",
]
