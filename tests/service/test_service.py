"""The prediction service's HTTP behaviour: predictions, batch, tokenization, concurrency, metrics
and every rejection path. Each test runs twice: in-process against an engine that answers at once
(`api[instant]`, seconds) and against the real service with the vLLM engine on the default model
(`api[vllm]`, one server per session), with the same assertions."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from medtpe.inference.engines.instant import PREFIX_BLOCK_TOKENS
from tests.support.service_support import (
    AUTH,
    Api,
    ServedApi,
    metric_value,
    post,
    record,
    synthetic_events,
)

pytestmark = [pytest.mark.timeout(900)]


def test_health_and_readiness(api: Api) -> None:
    assert api.get("/healthz").json() == {"status": "alive"}
    ready = api.get("/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready"
    assert body["model"]["mode"] == "medtpe"
    assert len(body["model"]["artefact_id"]) == 12


def test_predict(api: Api) -> None:
    options = {"n_samples": 3, "return_text": True, "return_probabilities": True}
    body = record(1, options=options)
    response = post(api, "/predict", body)
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["task"] == "icu_mortality"
    assert out["prediction"] in (True, False, None)
    assert out["format_ok"] == (out["prediction"] is not None)
    assert len(out["votes"]) == 3 and all(isinstance(v["text"], str) for v in out["votes"])
    probabilities = out["probabilities"]
    assert set(probabilities) == {"yes", "no"} and sum(probabilities.values()) == pytest.approx(1)
    assert all(0.0 <= p <= 1.0 for p in probabilities.values())
    tokens = out["tokens"]
    assert 0 < tokens["medtpe"] < tokens["original"] <= 1024
    assert tokens["compression_rate"] == pytest.approx(1 - tokens["medtpe"] / tokens["original"])
    assert 0 <= tokens["generated"] <= 16  # MEDTPE_MAX_NEW_TOKENS of the test service
    latency = out["latency_ms"]
    assert all(latency[k] > 0 for k in ("render", "tokenize", "generate", "total"))
    assert latency["total"] >= latency["generate"]
    last_event = max(e["time"] for e in body["events"] if e["time"])
    assert out["prediction_time"] > last_event  # default: just after the last event
    assert out["events"]["total"] == len(body["events"])
    model = out["model"]
    assert model["name"] == "smollm2-135m-instruct" and model["mode"] == "medtpe"
    assert len(model["base_fingerprint"]) == 64


def test_predict_long_record_is_cut_to_the_budget(api: Api) -> None:
    out = post(api, "/predict", record(2, 400)).json()
    assert out["probabilities"] is None  # not asked for
    assert out["tokens"]["original"] <= 1024
    assert 0 < out["events"]["kept"] < out["events"]["total"]


def test_tokenize_text_both_segmentations(api: Api) -> None:
    # longer than the default artefact's plain tail (its last 128 ids stay unmerged)
    text = "\n".join(f"[2150-01-01 08:{m:02d}] Heart Rate: {80 + m} bpm" for m in range(40))
    out = post(api, "/tokenize", {"text": text}).json()
    for side in ("original", "medtpe"):
        assert "".join(out[side]["tokens"]) == text
        assert out[side]["count"] == len(out[side]["ids"]) == len(out[side]["tokens"])
    assert out["medtpe"]["count"] < out["original"]["count"]
    assert out["compression_rate"] == pytest.approx(
        1 - out["medtpe"]["count"] / out["original"]["count"]
    )


def test_tokenize_record_matches_predict(api: Api) -> None:
    body = record(3)
    tokenized = post(api, "/tokenize", body).json()
    predicted = post(api, "/predict", body).json()
    assert tokenized["original"]["count"] == predicted["tokens"]["original"]
    assert tokenized["medtpe"]["count"] == predicted["tokens"]["medtpe"]


def test_batch_matches_single_requests(api: Api) -> None:
    records = [record(10 + i) for i in range(3)]
    batch = post(api, "/predict/batch", {"records": records})
    assert batch.status_code == 200, batch.text
    results = batch.json()["results"]
    assert len(results) == 3
    for r, result in zip(records, results, strict=True):
        single = post(api, "/predict", r).json()
        assert_same_answer(single, result)


def assert_same_answer(single: dict, other: dict) -> None:
    """Same record at temperature 0: same prompt, same parsed answer."""
    for key in ("original", "medtpe", "compression_rate"):
        assert other["tokens"][key] == single["tokens"][key]
    assert other["prediction_time"] == single["prediction_time"]
    assert (other["prediction"], other["format_ok"]) == (single["prediction"], single["format_ok"])


def test_several_tasks_match_single_requests(api: Api) -> None:
    """A short record (every task's prompt holds it whole) asked two tasks at once: each answer
    is the one its task gets alone; both read the record, prefilled once for them, from the
    prefix cache (the same test on the real engine: vLLM's CPU backend keeps the prefill's
    blocks)."""
    tasks = ["icu_mortality", "readmission_30d"]
    body = record(40, 12, tasks=tasks)
    del body["task"]
    several = post(api, "/predict", body)
    assert several.status_code == 200, several.text
    results = several.json()["results"]
    assert [r["task"] for r in results] == tasks
    shared = several.json()["shared_tokens"]["medtpe"]
    assert shared >= PREFIX_BLOCK_TOKENS
    full_blocks = shared // PREFIX_BLOCK_TOKENS * PREFIX_BLOCK_TOKENS
    assert [r["cached_tokens"] for r in results] == [full_blocks] * 2
    for task, result in zip(tasks, results, strict=True):
        assert_same_answer(post(api, "/predict", record(40, 12, task=task)).json(), result)


def test_sixteen_concurrent_requests(api: Api) -> None:
    # short records: what is tested is sixteen requests in the engine at once, not their length
    records = [record(100 + i, 6) for i in range(16)]
    singles = [post(api, "/predict", r).json() for r in records]

    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda r: post(api, "/predict", r), records))
    assert [r.status_code for r in responses] == [200] * 16
    for single, response in zip(singles, responses, strict=True):
        assert_same_answer(single, response.json())


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "wrong"}, {"Authorization": "Basic x"}],
)
def test_unauthorized(api: Api, headers: dict) -> None:
    response = api.post("/predict", json=record(4), headers=headers)
    assert response.status_code == 401
    assert response.json()["error"] == "unauthorized"
    assert response.headers["www-authenticate"] == "Bearer"


def test_second_key_and_x_api_key_accepted(api: Api) -> None:
    response = api.post("/tokenize", json={"text": "x"}, headers={"X-API-Key": "test-key-2"})
    assert response.status_code == 200


def test_request_too_large(api: Api) -> None:
    big = {"text": "x" * 300_000}
    assert post(api, "/tokenize", big).status_code == 413

    def chunks():  # no Content-Length: counted while it streams in
        data = json.dumps(big).encode()
        for i in range(0, len(data), 65536):
            yield data[i : i + 65536]

    response = api.post(
        "/tokenize",
        content=chunks(),
        headers={**AUTH, "content-type": "application/json"},
    )
    assert response.status_code == 413
    assert response.json()["error"] == "too_large"


@pytest.mark.parametrize(
    ("mutate", "loc"),
    [
        (lambda b: b["events"][1].update(time="not a time"), ["body", "events", 1, "time"]),
        (
            lambda b: b["events"][2].update(numeric_value="high"),
            ["body", "events", 2, "numeric_value"],
        ),
        (lambda b: b["events"][0].pop("code"), ["body", "events", 0, "code"]),
        (lambda b: b.update(options={"constrained": 1}), ["body", "options", "constrained"]),
        (lambda b: b.update(events=[]), ["body", "events"]),
        (lambda b: b.update(options={"n_samples": 0}), ["body", "options", "n_samples"]),
        (lambda b: b.update(options={"n_samples": 99}), ["body", "options", "n_samples"]),
        (lambda b: b.pop("task"), ["body", "task"]),
    ],
)
def test_schema_errors_name_the_field(api: Api, mutate, loc) -> None:
    body = record(5)
    mutate(body)
    response = post(api, "/predict", body)
    assert response.status_code == 422
    out = response.json()
    assert out["error"] == "invalid_request"
    assert loc in [item["loc"] for item in out["detail"]]


def test_unknown_task(api: Api) -> None:
    response = post(api, "/predict", record(6) | {"task": "horoscope"})
    assert response.status_code == 422
    out = response.json()
    assert out["error"] == "unknown_task"
    assert out["detail"][0]["loc"] == ["body", "task"]
    assert "icu_mortality" in out["detail"][0]["msg"]
    batch = post(api, "/predict/batch", {"records": [record(7), record(8) | {"task": "x"}]})
    assert batch.status_code == 422
    assert batch.json()["detail"][0]["loc"] == ["body", "records", 1, "task"]


def test_tokenize_needs_text_or_record(api: Api) -> None:
    assert post(api, "/tokenize", {}).status_code == 422
    assert post(api, "/tokenize", {"events": synthetic_events(1, 3)}).status_code == 422


def test_metrics_after_traffic(api: Api) -> None:
    post(api, "/predict", record(9))
    api.post("/predict", json=record(9))  # unauthorized
    post(api, "/predict", record(9) | {"task": "x"})  # unknown task
    post(api, "/predict", record(9) | {"events": []})  # invalid
    text = api.get("/metrics", headers=AUTH).text
    m = metric_value
    assert (
        m(text, "medtpe_request_latency_seconds_count", endpoint="predict", task="icu_mortality")
        >= 1
    )
    assert (
        m(text, "medtpe_generation_latency_seconds_count", task="icu_mortality", mode="medtpe") >= 1
    )
    original = m(text, "medtpe_prompt_tokens_total", tokenizer="original", task="icu_mortality")
    medtpe = m(text, "medtpe_prompt_tokens_total", tokenizer="medtpe", task="icu_mortality")
    assert original > medtpe > 0
    assert m(text, "medtpe_prompt_tokens_count", tokenizer="medtpe", task="icu_mortality") >= 1
    assert m(text, "medtpe_compression_rate_count", task="icu_mortality") >= 1
    compliance = sum(
        m(text, "medtpe_format_compliance_total", task="icu_mortality", result=r)
        for r in ("ok", "fail")
    )
    assert compliance >= 1
    for reason in ("unauthorized", "unknown_task", "invalid"):
        assert m(text, "medtpe_rejections_total", reason=reason) >= 1
    assert m(text, "medtpe_inflight_requests") == 0
    assert m(text, "medtpe_engine_ready") == 1
    # no patient data in labels, nor in the log
    for needle in ("LAB//", "2150-", "subject"):
        assert needle not in text
    if isinstance(api, ServedApi):
        log = api.server.log()
        assert "LAB//220045" not in log and "numeric_value" not in log
