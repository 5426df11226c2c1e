"""A fuzz run of the CDS Hooks routes, which the service's OpenAPI document leaves out (their
contract is the CDS Hooks specification; tests/service/predict/test_api_contract.py fuzzes the
rest). schemathesis generates requests from an OpenAPI 3.1 document built here from the
specification's JSON schemas (tests/fixtures/cds_hooks/schemas): schema-valid and schema-invalid
bodies and service ids, each sent over HTTP to the service on 127.0.0.1 with a valid JWT for
its exact URL. Every answer must be documented (status, content type, body: the
specification's for a 200, the service's located error body for a 404 or 422), schema-invalid
requests refused, never a 500. Seed `SEED`; up to `REQUESTS` requests per hook and feedback
operation and mode (schema-valid, schema-invalid), one for discovery; each run prints its count
and statuses."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from medtpe.core.cds.services import SERVICES, get_service
from tests.support.bad_requests import assert_answered
from tests.support.ehr import Ehr
from tests.support.paths import FIXTURES
from tests.support.properties import examples
from tests.support.service_support import free_port, instant_settings, served_in_thread

SEED = 1
REQUESTS = examples(60)
SPEC = FIXTURES / "cds_hooks" / "schemas" / "cds-hooks-2.0.1.schema.json"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
ERROR_BODY = {
    "type": "object",
    "required": ["error", "detail"],
    "properties": {
        "error": {"type": "string"},
        "detail": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["loc", "msg", "type"],
                "properties": {
                    "loc": {"type": "array", "minItems": 1},
                    "msg": {"type": "string"},
                    "type": {"type": "string"},
                },
            },
        },
    },
}
"""A 404 or 422: the service's error body, locating the problem."""
NOT_AVAILABLE = {
    "type": "object",
    "required": ["error", "detail"],
    "properties": {"error": {"type": "string"}},
}
"""A 412 or 503: what the service could not do, and why."""


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def cds_document() -> dict[str, Any]:
    """The CDS Hooks routes as an OpenAPI 3.1 document, on the specification's schemas."""
    spec = json.loads(SPEC.read_text())
    defs = json.loads(json.dumps(spec["$defs"]).replace("#/$defs/", "#/components/schemas/"))
    service_id = {
        "name": "service_id",
        "in": "path",
        "required": True,
        "schema": {"enum": [s.id for s in SERVICES]},
    }
    refused = {"401": {"description": "No acceptable JWT (bare)."}}
    located = {
        "404": _json(ERROR_BODY, "No such service."),
        "422": _json(ERROR_BODY, "Invalid request."),
    }
    unavailable = {
        "412": _json(NOT_AVAILABLE, "Prefetch missing, FHIR server not usable."),
        "503": _json(NOT_AVAILABLE, "Not ready."),
    }

    def body(name: str) -> dict[str, Any]:
        ref = {"$ref": f"#/components/schemas/{name}"}
        return {"required": True, "content": {"application/json": {"schema": ref}}}

    return {
        "openapi": "3.1.0",
        "info": {"title": "MedTPE CDS Hooks", "version": "2.0.1"},
        "paths": {
            "/cds-services": {
                "get": {
                    "responses": {
                        "200": _json(
                            {"$ref": "#/components/schemas/discoveryResponse"}, "The services."
                        ),
                        **refused,
                    }
                }
            },
            "/cds-services/{service_id}": {
                "post": {
                    "parameters": [service_id],
                    "requestBody": body("request"),
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/response"}, "The cards."),
                        **refused,
                        **located,
                        **unavailable,
                    },
                }
            },
            "/cds-services/{service_id}/feedback": {
                "post": {
                    "parameters": [service_id],
                    "requestBody": body("feedback"),
                    "responses": {"200": {"description": "Recorded."}, **refused, **located},
                }
            },
        },
        "components": {"schemas": defs},
    }


SCHEMA = schemathesis.openapi.from_dict(cds_document())
POSITIVE, NEGATIVE = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
RUNS = [
    ("GET", "/cds-services", POSITIVE),  # no input: one request
    ("POST", "/cds-services/{service_id}", POSITIVE),
    ("POST", "/cds-services/{service_id}", NEGATIVE),
    ("POST", "/cds-services/{service_id}/feedback", POSITIVE),
    ("POST", "/cds-services/{service_id}/feedback", NEGATIVE),
]


@pytest.fixture(scope="module")
def base_url(service_files: tuple[Path, Path], ehr: Ehr) -> Iterator[str]:
    """The service on 127.0.0.1, its public base URL its own; `ehr` may name one FHIR server,
    a closed port here (a generated `fhirServer` is another: refused before any connection)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings = instant_settings(
        service_files,
        cds_issuers=json.loads(ehr.issuers_setting(["http://127.0.0.1:9"])),
        cds_base_url=url,
        cds_fhir_timeout_s=2.0,
    )
    with served_in_thread(settings, port=port) as served:
        yield served


def _align(case: schemathesis.Case) -> None:
    """Give a schema-valid hook call its service's hook and the context ids the service needs,
    so that it reaches the prefetch and the FHIR mapping."""
    body = case.body
    service_id = (case.path_parameters or {}).get("service_id")
    if not isinstance(body, dict) or "hook" not in body or service_id is None:
        return
    body["hook"] = get_service(service_id).hook
    body["context"] = {**body["context"], "patientId": "p", "userId": "u", "encounterId": "e"}


@pytest.mark.parametrize(("method", "path", "mode"), RUNS)
def test_the_cds_routes_keep_their_contract_under_fuzzing(
    base_url: str, ehr: Ehr, method: str, path: str, mode: GenerationMode
) -> None:
    operation = SCHEMA[path][method]
    statuses: Counter[int] = Counter()

    @seed(SEED)
    @settings(
        max_examples=REQUESTS,
        database=None,
        deadline=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(mode), aligned=st.booleans())
    def fuzz(case: schemathesis.Case, aligned: bool) -> None:
        if aligned and mode is POSITIVE:
            _align(case)
        jwt = ehr.authorization(base_url + case.formatted_path)
        response = case.call(base_url=base_url, headers=jwt)
        statuses[response.status_code] += 1
        case.validate_response(response, checks=CHECKS)
        if response.status_code in {404, 422}:
            assert_answered(response, {404, 422})

    fuzz()
    print(f"{method} {path} {mode.value}: {statuses.total()} requests, seed {SEED}: {statuses}")
    assert statuses.total() >= (1 if method == "GET" else min(REQUESTS, 10))
