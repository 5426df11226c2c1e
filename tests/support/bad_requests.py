"""Requests an outside caller may send, for the tests that every one of them is answered with a
4xx locating the problem (or a legitimate answer), never a 500: arbitrary JSON values, bodies
shaped like the API's and the CDS hooks' with arbitrary values in their fields, raw bytes that
are no JSON, headers of any bytes; and the check of an answer's status and error body."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
from hypothesis import strategies as st

from medtpe.core.cds.services import SERVICES, CdsService
from medtpe.core.fhir.parsing import BUNDLE_TYPES
from medtpe.core.tasks import list_tasks

TASK_NAMES = list_tasks()
BAD_TASK_CHOICES = [
    ({"task": "icu_mortality", "tasks": ["phenotyping"]}, ["body", "tasks"], "task_and_tasks"),
    ({"tasks": []}, ["body", "tasks"], "too_short"),
    ({"tasks": [*TASK_NAMES[:2], TASK_NAMES[0]]}, ["body", "tasks", 2], "duplicate_task"),
    ({"tasks": [TASK_NAMES[0], "no_such_task"]}, ["body", "tasks", 1], "unknown_task"),
    ({"tasks": TASK_NAMES * 3}, ["body", "tasks"], "too_long"),
    ({"tasks": None}, ["body"], "value_error"),
    ({"tasks": TASK_NAMES[0]}, ["body", "tasks"], "list_type"),
]
"""Bad `task`/`tasks` choices of a record body, as (fields changed, the error's `loc`, its
`type`): `/predict`, `/predict/batch` and `/tokenize` answer each with a 422 there."""
DEEP = 10_000
"""Nesting depth of the deep bodies: far past any JSON decoder's recursion limit."""
LOCATED = {401, 413, 422}
"""Statuses whose `detail` must locate what is wrong (`[{"loc", "msg", "type"}]`)."""
LOC_ROOTS = {"body", "header", "path"}

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
"""Any JSON value."""


def objects(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with any subset of `fields` (each drawn from its strategy or as any JSON) and
    now and then a field of another name."""
    named = st.fixed_dictionaries({}, optional={k: v | JSON for k, v in fields.items()})
    extra = st.dictionaries(st.text(max_size=6), JSON, max_size=1)
    return st.builds(lambda a, b: b | a, named, extra)


EVENT = objects(
    {
        "subject_id": st.integers(-3, 3) | st.just(7),
        "time": st.sampled_from([None, "2150-01-01T08:00:00", "0000-01-01", "2150-13-40"])
        | st.text(max_size=20),
        "code": st.sampled_from(["MEDS_BIRTH", "LAB//220045//bpm", ""]) | st.text(max_size=8),
        "numeric_value": st.floats(allow_nan=False) | st.none(),
        "text_value": st.text(max_size=8) | st.none(),
    }
)
RESOURCE = objects(
    {
        "resourceType": st.sampled_from(
            ["Patient", "Observation", "Condition", "Encounter", "MedicationRequest", "Bundle"]
        ),
        "id": st.text(max_size=6),
        "subject": objects({"reference": st.sampled_from(["Patient/p", "Patient/q", ""])}),
        "gender": st.sampled_from(["female", "male", "other"]),
        "birthDate": st.sampled_from(["2100-01-01", "1900", "x"]),
        "code": objects({"coding": st.lists(objects({"system": JSON, "code": JSON}))}),
        "effectiveDateTime": st.sampled_from(["2150-01-01T08:00:00Z", "2150", ""]),
        "valueQuantity": objects({"value": st.floats(allow_nan=False), "unit": st.text()}),
        "status": st.sampled_from(["final", "entered-in-error"]),
    }
)
BUNDLE = objects(
    {
        "resourceType": st.just("Bundle"),
        "type": st.sampled_from(sorted(BUNDLE_TYPES)),
        "entry": st.lists(objects({"resource": RESOURCE | st.none()}), max_size=4),
        "link": st.lists(objects({"relation": st.just("next"), "url": st.text(max_size=12)})),
    }
)
OPTIONS = objects(
    {
        "n_samples": st.integers(-1, 12),
        "temperature": st.floats(-1, 3, allow_nan=False),
        "return_text": st.booleans(),
        "return_probabilities": st.booleans(),
        "constrained": st.booleans(),
        "max_input_tokens": st.integers(-1, 10**6),
        "both_modes": st.booleans(),
    }
)
RECORD = objects(
    {
        "task": st.sampled_from(list_tasks()),
        "tasks": st.lists(st.sampled_from([*list_tasks(), "x"]), max_size=4),
        "events": st.lists(EVENT, max_size=5),
        "bundle": BUNDLE,
        "prediction_time": st.sampled_from(["2150-01-02T00:00:00", "9999-12-31T23:59", "x"]),
        "options": OPTIONS,
    }
)
API_BODIES = {
    "/predict": RECORD,
    "/predict/batch": objects({"records": st.lists(RECORD, max_size=3)}),
    "/tokenize": objects(
        {
            "text": st.text(max_size=40),
            "task": st.sampled_from(list_tasks()),
            "tasks": st.lists(st.sampled_from([*list_tasks(), "x"]), max_size=4),
            "events": st.lists(EVENT, max_size=5),
            "prediction_time": st.just("2150-01-02T00:00:00"),
            "max_input_tokens": st.integers(-1, 10**6),
        }
    ),
}
"""Each API route's bodies: its own fields, with any value."""

SAFE_FHIR_SERVERS = ["http://127.0.0.1:9", "http://127.0.0.1:9/r4", "https://fhir.test.invalid/r4"]
"""The only `fhirServer` URLs drawn: a closed port on this machine (the one the tests' issuer may
name) and one outside the issuer's (refused before any connection)."""


def hook_bodies(service: CdsService) -> st.SearchStrategy[dict[str, Any]]:
    """Hook requests for `service`: its hook or another, a context with or without the ids,
    prefetch keys of its own or others holding resources, Bundles, null or anything."""
    hooks = st.sampled_from(sorted({s.hook for s in SERVICES}))
    context = objects(
        {
            "patientId": st.sampled_from(["p", "cds-patient-1", ""]),
            "userId": st.text(max_size=6),
            "encounterId": st.text(max_size=6),
        }
    )
    keys = st.sampled_from([*service.prefetch, "other"])
    prefetch = st.dictionaries(keys, st.none() | RESOURCE | BUNDLE, max_size=len(service.prefetch))
    authorization = objects(
        {
            "access_token": st.text(min_size=1, max_size=8),
            "token_type": st.just("Bearer"),
            "expires_in": st.integers(-1, 600),
            "scope": st.just("patient/*.read"),
            "subject": st.just("medtpe"),
        }
    )
    return objects(
        {
            "hook": hooks,
            "hookInstance": st.uuids().map(str),
            "context": context,
            "prefetch": prefetch,
            "fhirServer": st.sampled_from(SAFE_FHIR_SERVERS),
            "fhirAuthorization": authorization,
        }
    )


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> Any:
    """`base` (a valid request) with up to three of its values, at any depth, removed or
    replaced by any JSON value."""
    value = copy.deepcopy(base)
    for _ in range(draw(st.integers(0, 3))):
        parent: Any = None
        key: Any = None
        node = value
        while isinstance(node, dict | list) and node and draw(st.integers(0, 3)):
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            parent, key = node, draw(st.sampled_from(keys))
            node = parent[key]
        if parent is None:
            continue
        if draw(st.booleans()):
            del parent[key]
        else:
            parent[key] = draw(JSON)
    return value


@st.composite
def encoded(draw: st.DrawFn, values: st.SearchStrategy[Any]) -> bytes:
    """A value as JSON text, sometimes broken: truncated, with a byte that is no UTF-8, with a
    lone surrogate escape, or nested in thousands of arrays."""
    text = json.dumps(draw(values), ensure_ascii=draw(st.booleans())).encode()
    damage = draw(st.sampled_from(["none"] * 6 + ["truncate", "byte", "surrogate", "deep"]))
    at = draw(st.integers(0, len(text)))
    if damage == "truncate":
        return text[:at]
    if damage == "byte":
        return text[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + text[at:]
    if damage == "surrogate":
        return text.replace(b'"', b'"\\udc80', 1)
    if damage == "deep":
        return b"[" * DEEP + text + b"]" * DEEP
    return text


HEADER_BYTES = st.binary(max_size=24).filter(lambda b: not set(b) & set(b"\r\n\x00"))
"""A header value of any bytes a client can put on the wire."""


def assert_answered(answer: httpx.Response, allowed: set[int]) -> None:
    """The status is one of `allowed` (never a 500) and an error answer is the API's JSON error
    body, locating the problem where the status says the request is wrong."""
    assert answer.status_code in allowed, (answer.status_code, answer.text[:500])
    if answer.status_code < 400 or not answer.content:
        return
    body = answer.json()
    assert isinstance(body["error"], str), body
    if answer.status_code in LOCATED:
        assert isinstance(body["detail"], list) and body["detail"], body
        for item in body["detail"]:
            assert set(item) == {"loc", "msg", "type"}, item
            assert item["loc"] and item["loc"][0] in LOC_ROOTS, item
            assert isinstance(item["msg"], str) and isinstance(item["type"], str), item
