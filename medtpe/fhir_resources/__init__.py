"""The FHIR R4 resources written back to the EHR (`bundles`, pure functions on plain JSON): one
RiskAssessment and its Provenance per prediction, the model as a Device and its card as a
DocumentReference, in transaction Bundles; the batch job's write-back and the CDS hooks' system
actions send them."""

__all__ = ["bundles"]
