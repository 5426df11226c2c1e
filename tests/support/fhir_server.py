"""A local FHIR R4 server for the CDS Hooks tests, built on FHIRStarter (a maintained FastAPI
FHIR server framework; R4B models of fhir.resources): it holds the resources of the Bundle files
in a directory and answers what a CDS service asks of an EHR's FHIR server:

- reads: `Patient/{id}`, `Encounter/{id}`;
- type-level searches of Encounter, Observation, Condition, MedicationAdministration,
  MedicationRequest and Procedure by `patient`, `category` (token: `code` or `system|code`),
  `date` (prefixes `eq`, `lt`, `le`, `gt`, `ge`, repeatable), `_count` (page size), paged through
  `next` links (`_offset`);
- a bearer token: any other is 401;
- outside FHIR, the number of requests answered so far (`requests_served`: a test counts the
  reads a call made).

Run it as a process (`running_fhir_server`): `python -m tests.support.fhir_server --data DIR
--port N --token T` (FHIRStarter reads `FHIR_SEQUENCE=R4B` when imported). A patient whose id
starts with `broken-` gets a 500 on every search, one starting with `slow-` an answer after
`--delay-s` seconds (the service's error and timeout paths).
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx

SEARCHED = (
    "Encounter",
    "Observation",
    "Condition",
    "MedicationAdministration",
    "MedicationRequest",
    "Procedure",
)
WITH_CATEGORY = frozenset({"Observation", "Condition", "MedicationRequest", "Procedure"})
WITH_DATE = frozenset({"Encounter", "Observation", "MedicationRequest", "Procedure"})
"""The types R4 gives a `category` or a `date` search parameter (others ignore them, leniently)."""
DATE_FIELDS = (
    "effectiveDateTime",
    "effectivePeriod.start",
    "onsetDateTime",
    "recordedDate",
    "authoredOn",
    "performedDateTime",
    "performedPeriod.start",
    "period.start",
    "period.end",
    "effectivePeriod.end",
)
"""Where a resource's `date` search value is read, first found first."""
DEFAULT_COUNT = 100
REQUESTS_PATH = "/_test/requests"
"""Not FHIR: how many requests the server has answered (`requests_served`)."""


class Store:
    """Resources by type and id, and each type's resources by patient id (in file order)."""

    def __init__(self, data_dir: Path) -> None:
        self.by_id: dict[tuple[str, str], dict[str, Any]] = {}
        self.by_patient: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for path in sorted(data_dir.glob("*.json")):
            bundle = json.loads(path.read_text())
            for entry in bundle.get("entry", []):
                resource = entry["resource"]
                kind = resource["resourceType"]
                self.by_id[(kind, resource["id"])] = resource
                reference = (resource.get("subject") or {}).get("reference", "")
                if reference.startswith("Patient/"):
                    self.by_patient[(kind, reference.removeprefix("Patient/"))].append(resource)

    def search(
        self, kind: str, patient: str, category: str | None, dates: list[str]
    ) -> list[dict[str, Any]]:
        """The patient's resources of `kind` matching the category and every date condition."""
        found = self.by_patient.get((kind, patient), [])
        if category is not None:
            found = [r for r in found if _has_category(r, category)]
        for condition in dates:
            found = [r for r in found if _date_matches(r, condition)]
        return found


def _has_category(resource: dict[str, Any], token: str) -> bool:
    system, _, code = token.rpartition("|")
    categories = resource.get("category") or []
    if isinstance(categories, dict):
        categories = [categories]
    return any(
        coding.get("code") == code and (not system or coding.get("system") == system)
        for concept in categories
        for coding in concept.get("coding", [])
    )


def _date_of(resource: dict[str, Any]) -> datetime | None:
    for path in DATE_FIELDS:
        value: Any = resource
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, str):
            return _parse(value)
    return None


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).replace(tzinfo=None)


def _date_matches(resource: dict[str, Any], condition: str) -> bool:
    prefix, value = (condition[:2], condition[2:]) if condition[:2].isalpha() else ("eq", condition)
    when, bound = _date_of(resource), _parse(value)
    if when is None:
        return False
    return {
        "eq": when == bound,
        "lt": when < bound,
        "le": when <= bound,
        "gt": when > bound,
        "ge": when >= bound,
    }[prefix]


def create_app(data_dir: Path, token: str, delay_s: float) -> Any:
    """The FHIRStarter app over the resources in `data_dir`."""
    from fastapi import Depends, Request
    from fhir.resources.R4B import get_fhir_model_class
    from fhir.resources.R4B.bundle import Bundle
    from fhirstarter import FHIRProvider, FHIRStarter, InteractionContext
    from fhirstarter.exceptions import (
        FHIRGeneralError,
        FHIRResourceNotFoundError,
        FHIRUnauthorizedError,
    )

    store = Store(data_dir)

    def bearer(request: Request) -> None:
        if request.headers.get("authorization") != f"Bearer {token}":
            raise FHIRUnauthorizedError("a valid bearer token is required")

    provider = FHIRProvider(dependencies=[Depends(bearer)])

    def reader(kind: str) -> Any:
        model = get_fhir_model_class(kind)

        async def read(context: InteractionContext, id_: str) -> Any:
            resource = store.by_id.get((kind, id_))
            if resource is None:
                raise FHIRResourceNotFoundError
            return model.model_validate(resource)

        return read

    def searcher(kind: str) -> Any:
        async def search(
            context: InteractionContext, patient: str | None, _count: str | None
        ) -> Bundle:
            query_params = context.request.query_params
            category = query_params.get("category") if kind in WITH_CATEGORY else None
            date = query_params.getlist("date") if kind in WITH_DATE else []
            patient_id = (patient or "").removeprefix("Patient/")
            if patient_id.startswith("broken-"):
                raise FHIRGeneralError(500, "error", "exception", "broken on purpose")
            if patient_id.startswith("slow-"):
                await asyncio.sleep(delay_s)
            found = store.search(kind, patient_id, category, date)
            count = int(_count) if _count else DEFAULT_COUNT
            offset = int(query_params.get("_offset", "0"))
            page = found[offset : offset + count]
            links = [{"relation": "self", "url": str(context.request.url)}]
            if offset + count < len(found):
                pairs = [(k, v) for k, v in query_params.multi_items() if k != "_offset"]
                pairs.append(("_offset", str(offset + count)))
                next_url = f"{str(context.request.base_url).rstrip('/')}/{kind}?{urlencode(pairs)}"
                links.append({"relation": "next", "url": next_url})
            return Bundle.model_validate(
                {
                    "resourceType": "Bundle",
                    "type": "searchset",
                    "total": len(found),
                    "link": links,
                    "entry": [{"resource": r, "search": {"mode": "match"}} for r in page] or None,
                }
            )

        search.__name__ = f"{kind.lower()}_search"
        return search

    for kind in ("Patient", "Encounter"):
        provider.read(get_fhir_model_class(kind))(reader(kind))
    for kind in SEARCHED:
        provider.search_type(get_fhir_model_class(kind))(searcher(kind))
    app = FHIRStarter(title="MedTPE test FHIR server")
    app.add_providers(provider)
    served = {"requests": 0}

    @app.middleware("http")
    async def count(request: Request, call_next: Any) -> Any:
        if request.url.path != REQUESTS_PATH:
            served["requests"] += 1
        return await call_next(request)

    @app.get(REQUESTS_PATH)
    async def requests() -> dict[str, int]:
        return served

    return app


def requests_served(url: str) -> int:
    """How many requests the server at `url` has answered so far (this count's own left out)."""
    return httpx.get(url + REQUESTS_PATH, timeout=5).json()["requests"]


@contextmanager
def running_fhir_server(
    data_dir: Path, token: str, log_path: Path, delay_s: float = 30.0
) -> Iterator[str]:
    """The server in a process on 127.0.0.1; yields its base URL once it answers."""
    from tests.support.service_support import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = log_path.open("wb")
    command = [sys.executable, "-m", "tests.support.fhir_server", "--data", str(data_dir)]
    command += ["--port", str(port), "--token", token, "--delay-s", str(delay_s)]
    root = Path(__file__).resolve().parents[2]
    env = os.environ | {"FHIR_SEQUENCE": "R4B", "PYTHONPATH": str(root)}
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    try:
        deadline = time.monotonic() + 120
        with httpx.Client(timeout=2) as client:  # one TLS context for every poll
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"FHIR server exited:\n{log_path.read_text()[-3000:]}")
                try:
                    client.get(url + "/metadata")
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise TimeoutError("FHIR server did not start") from None
                    time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def main() -> None:
    """`python -m tests.support.fhir_server --data DIR --port N --token T [--delay-s S]`."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--delay-s", type=float, default=30.0)
    args = parser.parse_args()
    app = create_app(args.data, args.token, args.delay_s)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
