"""The CDS Hooks service on the instant engine (the model's answer is not under test here; one
real-engine test end to end: test_cds_hooks_engine.py): a real FHIR server process (FHIRStarter)
holding the test patient, a JWK Set served over HTTP, the app in-process."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError
from starlette.testclient import TestClient

from medtpe.core.cds.services import SERVICES, get_service
from medtpe.core.fhir import load_site_mapping, meds_from_fhir
from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
from medtpe.core.meds import MedsDataset, read_labels
from medtpe.core.tasks import get_task
from medtpe.service.cds_hooks.prefetch import FHIR_UNAVAILABLE_TEXT
from medtpe.service.cds_hooks.schemas import FeedbackRequest
from tests.support.cds_support import (
    FHIR_TOKEN,
    ICU_PATIENT,
    hook_request,
    load_bundle,
    patient_id,
    prefetch_of,
)
from tests.support.ehr import Ehr
from tests.support.hostile_fhir import audit_lines
from tests.support.mimic_fhir_fixture import FIXTURE
from tests.support.paths import FIXTURES, ROOT
from tests.support.service_support import (
    SERVICE_API_KEY,
    instant_client,
    instant_settings,
    metric_value,
)

ICU = get_service("medtpe-icu-mortality-patient-view")
BASE = "http://testserver"
API_KEY = {"Authorization": f"Bearer {SERVICE_API_KEY}"}
UNREACHABLE = "http://127.0.0.1:9"
"""A FHIR server the test issuer may name that nothing answers (the discard port)."""
HOSPITAL_FHIR = "https://fhir.hospital.test.invalid/r4"
FETCH_DEADLINE_S = 2.0
"""The module service's FHIR fetch deadline: a full fetch from the test server takes well under
0.5 s; its `slow-` patients answer after 6 s."""


@pytest.fixture(scope="module")
def client(service_files: tuple[Path, Path], ehr: Ehr, fhir_server: str) -> Iterator[TestClient]:
    settings = instant_settings(
        service_files,
        cds_issuers=json.loads(ehr.issuers_setting([fhir_server, UNREACHABLE])),
        cds_base_url=BASE,
        cds_allow_http_fhir=True,
        cds_fhir_timeout_s=FETCH_DEADLINE_S,
    )
    with instant_client(settings) as client:
        yield client


def call(client: TestClient, ehr: Ehr, body: dict[str, Any], service_id: str = ICU.id, **claims):
    url = f"/cds-services/{service_id}"
    return client.post(url, json=body, headers=ehr.authorization(BASE + url, **claims))


def prefetched(**drop: bool) -> dict[str, Any]:
    prefetch = prefetch_of(ICU, load_bundle(), ICU_PATIENT)
    return {k: v for k, v in prefetch.items() if not drop.get(k)}


def test_discovery_lists_one_service_per_task_and_hook(client: TestClient, ehr: Ehr) -> None:
    answer = client.get("/cds-services", headers=ehr.authorization(BASE + "/cds-services"))
    assert answer.status_code == 200
    services = answer.json()["services"]
    assert {(s["id"], s["hook"]) for s in services} == {(s.id, s.hook) for s in SERVICES}
    hooks = {s["hook"] for s in services}
    assert hooks == {"patient-view", "encounter-start", "encounter-discharge"}
    for service in services:
        assert service["prefetch"]["patient"] == "Patient/{{context.patientId}}"
        assert all("{{context.patientId}}" in q for q in service["prefetch"].values())
        assert None not in service.values()


def test_a_prefetched_record_gets_one_risk_card(client: TestClient, ehr: Ehr) -> None:
    answer = call(client, ehr, hook_request(ICU, ICU_PATIENT, prefetch=prefetched()))
    assert answer.status_code == 200, answer.text
    (card,) = answer.json()["cards"]
    model = client.get("/readyz").json()["model"]
    # the instant engine puts p(yes) at 0.75: above the ICU task's critical threshold (0.35)
    assert card["indicator"] == "critical"
    assert card["summary"] == "ICU mortality: high risk (75%)" and len(card["summary"]) < 140
    assert "**Probability:** 0.75" in card["detail"]
    assert "31 of 31 events" in card["detail"]
    assert "recorded 2150-03-01 08:00 to" in card["detail"]
    assert f"artefact `{model['artefact_id']}`" in card["detail"]
    assert "prompt tokens" in card["detail"] and "fewer)" in card["detail"]
    assert card["source"]["url"] == "http://testserver/model-card.xml"  # the service's own
    assert card["extension"]["prediction_id"] == card["uuid"]
    assert card["selectionBehavior"] == "at-most-one" and len(card["suggestions"]) == 1
    assert all(reason["display"] for reason in card["overrideReasons"])


def test_missing_prefetch_is_fetched_from_the_fhir_server_with_the_same_prompt(
    client: TestClient, ehr: Ehr, fhir_server: str
) -> None:
    engine = client.app.state.service.engine
    client.app.state.cds_hooks.scores.store.clear()
    call(client, ehr, hook_request(ICU, ICU_PATIENT, prefetch=prefetched()))
    from_prefetch = engine.prompts[-1]
    client.app.state.cds_hooks.scores.store.clear()
    partial = prefetched(observations=True, patient=True)
    body = hook_request(ICU, ICU_PATIENT, prefetch=partial, fhir_server=fhir_server)
    answer = call(client, ehr, body)
    assert answer.status_code == 200, answer.text
    assert engine.prompts[-1] == from_prefetch
    client.app.state.cds_hooks.scores.store.clear()
    fetched_all = hook_request(ICU, ICU_PATIENT, fhir_server=fhir_server)
    assert call(client, ehr, fetched_all).status_code == 200
    assert engine.prompts[-1] == from_prefetch


def test_an_operation_outcome_in_place_of_a_prefetch_is_fetched(
    client: TestClient, ehr: Ehr, fhir_server: str
) -> None:
    prefetch = prefetched()
    prefetch["observations"] = {"resourceType": "OperationOutcome", "issue": []}
    without_server = call(client, ehr, hook_request(ICU, ICU_PATIENT, prefetch=prefetch))
    assert without_server.status_code == 412
    assert without_server.json()["error"] == "prefetch_missing"
    body = hook_request(ICU, ICU_PATIENT, prefetch=prefetch, fhir_server=fhir_server)
    assert call(client, ehr, body).status_code == 200


@pytest.mark.parametrize(
    ("patient", "token", "server", "detail"),
    [
        ("broken-1", FHIR_TOKEN, None, ": status 500"),
        ("slow-1", FHIR_TOKEN, None, f"no answer within {FETCH_DEADLINE_S:g} s"),
        (ICU_PATIENT, "a-token-the-server-refuses", None, "status 401: token refused"),
        (ICU_PATIENT, FHIR_TOKEN, UNREACHABLE, "no answer (ConnectError)"),
    ],
)
def test_a_failing_fhir_server_is_a_412_saying_only_fhir_unavailable(
    client: TestClient,
    ehr: Ehr,
    fhir_server: str,
    caplog: pytest.LogCaptureFixture,
    patient: str,
    token: str,
    server: str | None,
    detail: str,
) -> None:
    """Whatever failed, the caller learns only `fhir_unavailable` (the reasons would map which
    hosts and ports answer); what failed is in the audit line."""
    fhir = server or fhir_server
    body = hook_request(ICU, patient, prefetch={"patient": None}, fhir_server=fhir, token=token)
    with caplog.at_level(logging.INFO):
        answer = call(client, ehr, body)
    assert answer.status_code == 412
    assert answer.json() == {"error": "fhir_unavailable", "detail": FHIR_UNAVAILABLE_TEXT}
    audit = audit_lines(caplog)[-1]
    assert (audit["outcome"], audit["reason"]) == ("precondition", "fhir_unavailable")
    assert detail in audit["detail"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert token not in answer.text and token not in logged


def test_a_fetch_outside_the_issuers_fhir_servers_is_refused(
    client: TestClient, service_files: tuple[Path, Path], ehr: Ehr, fhir_server: str
) -> None:
    """Another server than the issuer's (the module's service: http allowed, the issuer names
    `fhir_server` and `UNREACHABLE`), or an http one without MEDTPE_CDS_ALLOW_HTTP_FHIR (a
    service of its own: the issuer names the server)."""
    elsewhere = call(client, ehr, hook_request(ICU, ICU_PATIENT, fhir_server=HOSPITAL_FHIR))
    issuers = json.loads(ehr.issuers_setting([fhir_server]))
    values = {"cds_issuers": issuers, "cds_allow_http_fhir": False}
    with instant_client(instant_settings(service_files, cds_base_url=BASE, **values)) as other:
        plain_http = call(other, ehr, hook_request(ICU, ICU_PATIENT, fhir_server=fhir_server))
    for answer in (elsewhere, plain_http):
        assert (answer.status_code, answer.json()["error"]) == (412, "fhir_server_not_allowed")


def test_the_same_record_is_answered_from_the_score_cache_until_it_changes(
    client: TestClient, ehr: Ehr
) -> None:
    engine = client.app.state.service.engine
    client.app.state.cds_hooks.scores.store.clear()
    first = call(client, ehr, hook_request(ICU, ICU_PATIENT, prefetch=prefetched()))
    n_prompts = len(engine.prompts)
    again = call(client, ehr, hook_request(ICU, ICU_PATIENT, prefetch=prefetched()))
    assert len(engine.prompts) == n_prompts
    assert "an earlier call's score" in again.json()["cards"][0]["detail"]
    assert again.json()["cards"][0]["uuid"] != first.json()["cards"][0]["uuid"]
    grown = prefetched()
    new = copy.deepcopy(grown["observations"]["entry"][-1])
    new["resource"]["id"] = "obs-new"
    new["resource"]["effectiveDateTime"] = "2150-03-02T08:00:00Z"
    grown["observations"]["entry"].append(new)
    changed = call(client, ehr, hook_request(ICU, ICU_PATIENT, prefetch=grown))
    assert len(engine.prompts) == n_prompts + 1
    assert "32 of 32 events" in changed.json()["cards"][0]["detail"]
    other_tenant = call(client, ehr, hook_request(ICU, ICU_PATIENT, prefetch=grown), tenant="b")
    assert len(engine.prompts) == n_prompts + 2  # another tenant never shares a score
    assert engine.cache_salts[-1] != engine.cache_salts[-2]
    assert other_tenant.status_code == 200


def test_feedback_is_counted_per_outcome(client: TestClient, ehr: Ehr) -> None:
    card = call(client, ehr, hook_request(ICU, ICU_PATIENT, prefetch=prefetched())).json()
    card = card["cards"][0]
    url = f"/cds-services/{ICU.id}/feedback"
    accepted = {
        "card": card["uuid"],
        "outcome": "accepted",
        "acceptedSuggestions": [{"id": card["suggestions"][0]["uuid"]}],
        "outcomeTimestamp": "2026-11-25T10:05:31Z",
    }
    overridden = {
        "card": card["uuid"],
        "outcome": "overridden",
        "overrideReason": {"reason": card["overrideReasons"][0], "userComment": "seen"},
        "outcomeTimestamp": "2026-11-25T10:06:00Z",
    }
    before = client.get("/metrics", headers=API_KEY).text
    body = {"feedback": [accepted, overridden, overridden]}
    answer = client.post(url, json=body, headers=ehr.authorization(BASE + url))
    assert answer.status_code == 200
    after = client.get("/metrics", headers=API_KEY).text
    for outcome, n in (("accepted", 1), ("overridden", 2)):
        labels = {"service": ICU.id, "outcome": outcome}
        was = metric_value(before, "medtpe_cds_feedback_total", **labels)
        assert metric_value(after, "medtpe_cds_feedback_total", **labels) == was + n
    no_suggestion = {"feedback": [accepted | {"acceptedSuggestions": []}]}
    refused = client.post(url, json=no_suggestion, headers=ehr.authorization(BASE + url))
    assert refused.status_code == 422


@pytest.mark.parametrize(
    ("change", "status", "loc"),
    [
        (lambda b: b.update(hook="encounter-start"), 422, ["body", "hook"]),
        (lambda b: b["context"].pop("patientId"), 422, ["body", "context", "patientId"]),
        (lambda b: b["prefetch"].update(patient="123"), 422, ["body", "prefetch", "patient"]),
        (
            lambda b: b["prefetch"]["observations"]["entry"][2]["resource"].pop("code"),
            422,
            ["body", "prefetch", "observations", "entry", 2, "resource", "code"],
        ),
        (
            lambda b: b["prefetch"]["observations"]["entry"][0]["resource"].update(
                subject={"reference": "Patient/someone-else"}
            ),
            422,
            ["body", "prefetch", "observations", "entry", 0, "resource", "subject", "reference"],
        ),
    ],
)
def test_bad_input_is_a_422_naming_the_field(
    client: TestClient, ehr: Ehr, change: Any, status: int, loc: list
) -> None:
    body = hook_request(ICU, ICU_PATIENT, prefetch=prefetched())
    change(body)
    answer = call(client, ehr, body)
    assert answer.status_code == status, answer.text
    assert answer.json()["detail"][0]["loc"] == loc


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (b'{"hook": "patient-view", "prefetch": {', ["body"]),  # not JSON
        (b"[1, 2]", ["body"]),  # JSON, not an object
        (None, ["body", "prefetch"]),  # prefetch not an object
        (None, ["body", "prefetch", "observations"]),  # a Bundle's entries not objects
    ],
)
def test_a_body_the_service_cannot_read_is_a_422_locating_it(
    client: TestClient, ehr: Ehr, body: bytes | None, loc: list
) -> None:
    if body is None:
        request = hook_request(ICU, ICU_PATIENT, prefetch=prefetched())
        if loc[-1] == "prefetch":
            request["prefetch"] = ["not", "an", "object"]
        else:
            request["prefetch"]["observations"]["entry"][3] = "not an entry"
        body = json.dumps(request).encode()
    url = f"/cds-services/{ICU.id}"
    headers = {"content-type": "application/json"} | ehr.authorization(BASE + url)
    answer = client.post(url, content=body, headers=headers)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == loc


def test_an_unknown_service_is_a_404_after_authentication(client: TestClient, ehr: Ehr) -> None:
    body = hook_request(ICU, ICU_PATIENT, prefetch=prefetched())
    assert call(client, ehr, body, service_id="no-such-service").status_code == 404
    assert client.post("/cds-services/no-such-service", json=body).status_code == 401


def test_each_call_writes_one_audit_line_without_secrets_or_record_content(
    client: TestClient, ehr: Ehr, fhir_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = hook_request(ICU, ICU_PATIENT, prefetch=prefetched(observations=True))
    body["fhirServer"] = fhir_server
    body["fhirAuthorization"] = hook_request(ICU, ICU_PATIENT, fhir_server=fhir_server)[
        "fhirAuthorization"
    ]
    token = ehr.token(BASE + f"/cds-services/{ICU.id}")
    with caplog.at_level(logging.INFO):
        answer = client.post(
            f"/cds-services/{ICU.id}", json=body, headers={"Authorization": f"Bearer {token}"}
        )
        client.post(f"/cds-services/{ICU.id}", json=body, headers={"Authorization": "Bearer x"})
    assert answer.status_code == 200
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "medtpe.audit"]
    assert [line["outcome"] for line in lines][-2:] in (
        ["card", "unauthorized"],
        ["cached", "unauthorized"],
    )
    audit = lines[-2]
    assert audit["hookInstance"] == body["hookInstance"]
    assert (audit["issuer"], audit["tenant"], audit["service"]) == (ehr.issuer, "tenant-a", ICU.id)
    assert audit["card"] == answer.json()["cards"][0]["uuid"] and audit["latency_ms"] > 0
    assert audit["artefact"] == client.get("/readyz").json()["model"]["artefact_id"]
    assert lines[-1]["reason"] == "malformed_token"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for secret in (token, FHIR_TOKEN, "220045", "2150-03-01", "cds-patient-1"):
        assert secret not in logged


def _tokens(ehr: Ehr, aud: str) -> dict[str, str | None]:
    """Calls that must be refused, by what is wrong with their JWT."""
    import time

    import jwt

    now = int(time.time())
    claims = {"iss": ehr.issuer, "aud": aud, "exp": now + 60, "iat": now, "jti": "j"}
    impostor = Ehr(jwks_url=ehr.jwks_url)  # same issuer and kid, another key
    return {
        "no token": None,
        "not a JWT": "garbage",
        "expired": ehr.token(aud, exp=now - 120, iat=now - 400),
        "issued in the future": ehr.token(aud, iat=now + 600, exp=now + 700),
        "another endpoint's aud": ehr.token(BASE + "/cds-services"),
        "unknown issuer": ehr.token(aud, iss="https://elsewhere.invalid"),
        "no jti": ehr.token(aud, jti=None),
        "no exp": ehr.token(aud, exp=None),
        "lifetime over the limit": ehr.token(aud, exp=now + 3600),
        "unknown kid": ehr.token(aud, headers={"kid": "other-key"}),
        "jku not the issuer's": ehr.token(aud, headers={"jku": "http://127.0.0.1:9/jwks"}),
        "no typ": ehr.token(aud, headers={"typ": None}),
        "signed by another key": impostor.token(aud),
        "HMAC": jwt.encode(claims, "shared-secret-x" * 3, "HS256", headers={"kid": ehr.kid}),
        "alg none": jwt.encode(claims, None, "none", headers={"kid": ehr.kid, "typ": "JWT"}),
    }


def test_every_unacceptable_jwt_is_a_bare_401(client: TestClient, ehr: Ehr) -> None:
    url = f"/cds-services/{ICU.id}"
    body = hook_request(ICU, ICU_PATIENT, prefetch=prefetched())
    for why, token in _tokens(ehr, BASE + url).items():
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        answer = client.post(url, json=body, headers=headers)
        assert (why, answer.status_code, answer.content) == (why, 401, b"")
        assert answer.headers["www-authenticate"] == "Bearer"
    assert client.get("/cds-services").status_code == 401


def test_a_jwt_is_accepted_once_only(client: TestClient, ehr: Ehr) -> None:
    url = f"/cds-services/{ICU.id}"
    body = hook_request(ICU, ICU_PATIENT, prefetch=prefetched())
    headers = {"Authorization": f"Bearer {ehr.token(BASE + url, jku=None)}"}
    assert client.post(url, json=body, headers=headers).status_code == 200
    assert client.post(url, json=body, headers=headers).status_code == 401
    listed = ehr.token(BASE + url, aud=[BASE + url], headers={"jku": ehr.jwks_url})
    answer = client.post(url, json=body, headers={"Authorization": f"Bearer {listed}"})
    assert answer.status_code == 200  # aud as a list, jku naming the issuer's own set


# --- the contract: bodies against the CDS Hooks JSON schemas (tests/fixtures/cds_hooks) -----

SCHEMAS = FIXTURES / "cds_hooks" / "schemas"
SAMPLE_REQUEST = ROOT / "docs" / "examples" / "cds-hook-patient-view.json"


def spec_validator(definition: str) -> jsonschema.Draft202012Validator:
    """A validator of one body of the CDS Hooks 2.0.1 schema (formats checked)."""
    schema = json.loads((SCHEMAS / "cds-hooks-2.0.1.schema.json").read_text())
    return jsonschema.Draft202012Validator(
        schema | {"$ref": f"#/$defs/{definition}"},
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )


def test_discovery_keeps_the_spec_and_the_cds_validators_schema(
    client: TestClient, ehr: Ehr
) -> None:
    body = client.get("/cds-services", headers=ehr.authorization(BASE + "/cds-services")).json()
    spec_validator("discoveryResponse").validate(body)
    legacy = json.loads((SCHEMAS / "cds-validator-discovery-response.json").read_text())
    jsonschema.Draft3Validator(legacy).validate(body)
    with pytest.raises(jsonschema.ValidationError):  # the schemas do check
        spec_validator("discoveryResponse").validate({"services": [{"hook": "patient-view"}]})


def test_the_sample_request_and_its_card_keep_the_spec(client: TestClient, ehr: Ehr) -> None:
    request = json.loads(SAMPLE_REQUEST.read_text())
    spec_validator("request").validate(request)
    answer = call(client, ehr, request)
    assert answer.status_code == 200, answer.text
    spec_validator("response").validate(answer.json())
    for broken in (
        {"cards": [{"summary": "x" * 140, "indicator": "info", "source": {"label": "s"}}]},
        {"cards": [{"summary": "x", "indicator": "hard-stop", "source": {"label": "s"}}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            spec_validator("response").validate(broken)


def test_every_service_answers_with_cards_that_keep_the_spec(client: TestClient, ehr: Ehr) -> None:
    for service in SERVICES:
        prefetch = prefetch_of(service, load_bundle(), ICU_PATIENT)
        request = hook_request(service, ICU_PATIENT, prefetch=prefetch)
        spec_validator("request").validate(request)
        answer = call(client, ehr, request, service_id=service.id)
        assert answer.status_code == 200, answer.text
        spec_validator("response").validate(answer.json())
        card = answer.json()["cards"][0]
        assert card["summary"].startswith(get_task(service.task).title)


def test_feedback_bodies_the_service_accepts_keep_the_spec() -> None:
    accepted = {
        "card": "4e0a3a1e-3283-4575-ab82-028d55fe2719",
        "outcome": "accepted",
        "acceptedSuggestions": [{"id": "e56e1945-20b3-4393-8503-a1a20fd73152"}],
        "outcomeTimestamp": "2021-12-11T10:05:31Z",
    }
    overridden = {
        "card": "f6b95768-b1c8-40dc-8385-bf3504b82ffb",
        "outcome": "overridden",
        "overrideReason": {"reason": {"code": "d7ecf885", "system": "urn:x"}, "userComment": "c"},
        "outcomeTimestamp": "2020-12-11T00:00:00Z",
    }
    validator = spec_validator("feedback")
    for body in ({"feedback": [accepted]}, {"feedback": [overridden]}):
        validator.validate(body)
        FeedbackRequest.model_validate(body)
    bad = {"feedback": [accepted | {"acceptedSuggestions": None}]}
    bad["feedback"][0].pop("acceptedSuggestions")
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bad)
    with pytest.raises(ValidationError):
        FeedbackRequest.model_validate(bad)


# --- the round trip through the hook: MIMIC-IV demo ICU stays (ODbL fixture) -----------------


def test_a_mimic_stay_through_the_hook_shows_predicts_events(
    service_files: tuple[Path, Path], ehr: Ehr
) -> None:
    """The stays of tests/fixtures/fhir/mimic-demo-stays as FHIR, prefetched key by key as an EHR
    would (one resource type per key: events of one instant arrive grouped by type), give byte
    for byte the prompt `/predict` gives their MEDS events (the same events: the FHIR round trip,
    tests/core/fhir/test_fhir_round_trip.py): the renderer orders the lines of one instant by
    code (docs/integration.md, "The round trip through a hook")."""
    settings = instant_settings(
        service_files,
        max_input_tokens=8192,
        cds_issuers=json.loads(ehr.issuers_setting([HOSPITAL_FHIR])),
        cds_base_url=BASE,
    )
    dataset = MedsDataset.load(FIXTURE)
    with instant_client(settings) as client:
        engine = client.app.state.service.engine
        tokenizer = client.app.state.service.model.predictor.tokenizer
        for point in read_labels(FIXTURE / "labels" / "icu_mortality.parquet"):
            events = dataset.events(point.subject_id).before(point.prediction_time)
            bundle = fhir_bundle_from_meds(events)
            record = meds_from_fhir(bundle, mapping=load_site_mapping())
            as_meds = [e.model_dump(mode="json") for e in record.events]
            body = {"task": "icu_mortality", "events": as_meds}
            assert client.post("/predict", json=body, headers=API_KEY).status_code == 200
            from_meds = tokenizer.decode(engine.prompts[-1])
            patient = patient_id(bundle)
            request = hook_request(ICU, patient, prefetch=prefetch_of(ICU, bundle, patient))
            assert call(client, ehr, request).status_code == 200
            from_hook = tokenizer.decode(engine.prompts[-1])
            assert from_hook == from_meds
