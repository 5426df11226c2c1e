"""FHIR R4 records as MEDS events (pure Python: no torch, no HTTP).

    from medtpe.core.fhir import load_site_mapping, meds_from_fhir
    record = meds_from_fhir(bundle, mapping=load_site_mapping(), prediction_time=when)

`load_site_mapping` reads the per-site YAML mapping (None: the shipped default),
`meds_from_fhir` maps a Bundle or a list of resources to a `FhirRecord` (events, descriptions,
mapping counts, each faulty element it left out as a `FhirWarning`), a `ResourceCache` keeps
what each resource gave so that a record sent again with a few new resources only reads those,
and `FhirInputError` names the resource and field of input it cannot map.
Beside them: `mapping` (the resource types read), `parsing` (the Bundle types accepted),
`window` (how far back a record is read), `url_guard` (where a FHIR server's access token may
go). See docs/integration.md, "FHIR records".
"""

from medtpe.core.fhir.mapping import meds_from_fhir
from medtpe.core.fhir.parsing import FhirInputError, FhirWarning
from medtpe.core.fhir.record import FhirEvent, FhirRecord, MappingCounts, ResourceCounts
from medtpe.core.fhir.resource_cache import ResourceCache
from medtpe.core.fhir.site_mapping import SiteMapping, SiteMappingError, load_site_mapping

__all__ = [
    "FhirEvent",
    "FhirInputError",
    "FhirRecord",
    "FhirWarning",
    "MappingCounts",
    "ResourceCache",
    "ResourceCounts",
    "SiteMapping",
    "SiteMappingError",
    "load_site_mapping",
    "mapping",
    "meds_from_fhir",
    "parsing",
    "site_mapping",
    "url_guard",
    "window",
]
