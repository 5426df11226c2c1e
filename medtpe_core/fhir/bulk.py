"""A FHIR Bulk Data export (NDJSON, one file per resource type, as `$export` and synthetic data
generators such as clinosim write it) as one searchset Bundle per patient, the input of
`meds_from_fhir`.

    for bundle in patient_bundles(Path("export/")):
        record = meds_from_fhir(bundle, mapping=mapping)

Reads every `*.ndjson` file once; holds the export in memory.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PATIENT_FIELDS = ("subject", "patient")
"""The fields by which a resource names its patient (`Patient/<id>` references)."""


def patient_bundles(ndjson_dir: Path) -> Iterator[dict[str, Any]]:
    """One searchset Bundle per Patient of an NDJSON export directory: the Patient and every
    resource whose `subject` or `patient` references it, files in name order, lines in file
    order. Resources of no patient (Practitioner, Organization, ...) are left out."""
    owned: dict[str, list[dict[str, Any]]] = defaultdict(list)
    patients: list[dict[str, Any]] = []
    for path in sorted(Path(ndjson_dir).glob("*.ndjson")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            resource = json.loads(line)
            if resource.get("resourceType") == "Patient":
                patients.append(resource)
                continue
            for name in PATIENT_FIELDS:
                reference = (resource.get(name) or {}).get("reference", "")
                if isinstance(reference, str) and reference.startswith("Patient/"):
                    owned[reference.removeprefix("Patient/")].append(resource)
                    break
    for patient in patients:
        resources = [patient, *owned[patient.get("id", "")]]
        yield {
            "resourceType": "Bundle",
            "type": "searchset",
            "entry": [
                {"fullUrl": f"{r['resourceType']}/{r.get('id', i)}", "resource": r}
                for i, r in enumerate(resources)
            ],
        }
