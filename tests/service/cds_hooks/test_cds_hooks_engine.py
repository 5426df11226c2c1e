"""The CDS hooks end to end on the real engine: `medtpe serve` (the session's service), the EHR's
JWT, the record fetched from the FHIRStarter server; the card's answer is `/predict`'s on the
same record, a repeated call is served from the score cache, a record grown by one observation
is scored again on the engine's cached prefix."""

from __future__ import annotations

import copy
import json
import re

import httpx
import pytest

from medtpe.core.cds.services import get_service
from medtpe.core.fhir import load_site_mapping, meds_from_fhir
from tests.support.cds_support import (
    FHIR_TOKEN,
    ICU_PATIENT,
    hook_request,
    load_bundle,
    prefetch_of,
)
from tests.support.ehr import Ehr
from tests.support.service_support import SERVICE_API_KEY, ServiceProcess, metric_value

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(600)]

ICU = get_service("medtpe-icu-mortality-patient-view")
KEY = {"Authorization": f"Bearer {SERVICE_API_KEY}"}  # /metrics needs it where keys are set


def probability(card: dict) -> float:
    found = re.search(r"\*\*Probability:\*\* ([0-9.]+)", card["detail"])
    assert found, card["detail"]
    return float(found.group(1))


def test_a_hook_answers_as_predict_on_the_same_record(
    service_server: ServiceProcess, ehr: Ehr, fhir_server: str
) -> None:
    url = f"{service_server.url}/cds-services/{ICU.id}"
    with httpx.Client(timeout=300) as client:
        body = hook_request(ICU, ICU_PATIENT, fhir_server=fhir_server)  # nothing prefetched
        first = client.post(url, json=body, headers=ehr.authorization(url))
        assert first.status_code == 200, first.text
        card = first.json()["cards"][0]

        record = meds_from_fhir(load_bundle(), mapping=load_site_mapping(None))
        events = [e.model_dump(mode="json") for e in record.events]
        predicted = client.post(
            f"{service_server.url}/predict",
            json={
                "task": "icu_mortality",
                "events": events,
                "options": {"return_probabilities": True},
            },
            headers={"Authorization": f"Bearer {SERVICE_API_KEY}"},
        ).json()
        p_yes = predicted["probabilities"]["yes"]
        assert probability(card) == pytest.approx(p_yes, abs=0.005)
        tokens = predicted["tokens"]
        assert f"{tokens['original']:,} → {tokens['medtpe']:,} prompt tokens" in card["detail"]

        metrics = client.get(f"{service_server.url}/metrics", headers=KEY).text
        cached = client.post(url, json=body, headers=ehr.authorization(url)).json()["cards"][0]
        assert "an earlier call's score" in cached["detail"]
        assert probability(cached) == probability(card)
        after = client.get(f"{service_server.url}/metrics", headers=KEY).text
        calls = {"service": ICU.id, "outcome": "cached"}
        before_n = metric_value(metrics, "medtpe_cds_hook_calls_total", **calls)
        assert metric_value(after, "medtpe_cds_hook_calls_total", **calls) == before_n + 1
        generated = "medtpe_generation_latency_seconds_count"
        assert metric_value(after, generated, task="icu_mortality", mode="medtpe") == (
            metric_value(metrics, generated, task="icu_mortality", mode="medtpe")
        )

        grown = prefetch_of(ICU, load_bundle(), ICU_PATIENT)
        newest = copy.deepcopy(grown["observations"]["entry"][-1])
        newest["resource"] |= {"id": "obs-new", "effectiveDateTime": "2150-03-02T08:00:00Z"}
        grown["observations"]["entry"].append(newest)
        hits = metric_value(after, "vllm:prefix_cache_hits_total")
        again = client.post(
            url,
            json=hook_request(ICU, ICU_PATIENT, prefetch=grown),
            headers=ehr.authorization(url),
        )
        assert again.status_code == 200, again.text
        assert "an earlier call's score" not in again.json()["cards"][0]["detail"]
        final = client.get(f"{service_server.url}/metrics", headers=KEY).text
        assert metric_value(final, "vllm:prefix_cache_hits_total") > hits
    audit = [
        json.loads(line.split("medtpe.audit ", 1)[1])
        for line in service_server.log().splitlines()
        if "medtpe.audit " in line
    ]
    assert [a["outcome"] for a in audit[-3:]] == ["card", "cached", "card"]
    assert FHIR_TOKEN not in service_server.log()
