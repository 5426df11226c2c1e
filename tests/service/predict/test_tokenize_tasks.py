"""`/tokenize` with `tasks`: a record's prompts for several tasks, the part they share given once
and each task's tail, on the instant engine in-process. The shared part is the leading ids of
every task's prompt as `Predictor.prepare_all` builds it and as `/predict` feeds the engine
(its receipts' prompt digests); a `task` is answered as before; bad `tasks` are 422s naming the
field, as `/predict` states them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from medtpe.core.tasks import get_task, list_tasks
from medtpe.inference.record import MedsRecord
from medtpe.ledger.receipt import prompt_ids_digest
from medtpe.service.predict.schemas import PredictRequest
from medtpe.service.predict.task_choice import MAX_TASKS_PER_RECORD
from tests.support.bad_requests import BAD_TASK_CHOICES
from tests.support.service_support import instant_client, instant_settings, post, synthetic_events

pytestmark = [pytest.mark.timeout(300)]

TASKS = list_tasks()


@pytest.fixture(scope="module")
def client(service_files: tuple[Path, Path]) -> Iterator[TestClient]:
    with instant_client(instant_settings(service_files)) as client:
        yield client


def tokenized(client: TestClient, body: dict) -> dict:
    """`/tokenize`'s answer to `body`, which must be a 200."""
    answer = post(client, "/tokenize", body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_shared_part_leads_every_tasks_prompt_as_prepare_all_and_predict_build_it(
    client: TestClient,
) -> None:
    events = synthetic_events(31, 12)  # held whole by every task's prompt at 1,024 tokens
    out = tokenized(client, {"tasks": TASKS, "events": events})
    shared, results = out["shared"], out["results"]
    assert [r["task"] for r in results] == TASKS
    assert 0 < shared["medtpe"]["count"] < shared["original"]["count"]
    assert shared["medtpe"]["count"] == len(shared["medtpe"]["ids"])
    merged = {m["id"] for m in shared["merged"]}
    assert merged and merged <= set(shared["medtpe"]["ids"])

    predictor = client.app.state.service.model.predictor
    record = PredictRequest.model_validate({"tasks": TASKS, "events": events})
    assert record.events is not None
    prepared = MedsRecord(record.events, None).prepare_all(predictor, [get_task(t) for t in TASKS])
    for result, mine in zip(results, prepared, strict=True):
        seg = mine.segmentation
        for side, ids in (("original", seg.original_ids), ("medtpe", seg.medtpe_ids)):
            n = shared[side]["count"]
            assert ids[:n] == shared[side]["ids"]
            assert ids[n:] == result["tail"][side]["ids"]
            assert result["total"][side] == len(ids) == n + result["tail"][side]["count"]
        assert result["total"]["compression_rate"] == seg.compression_rate
        assert result["events"]["kept"] == result["events"]["total"] == len(events)
    assert out["max_input_tokens"] == 1024

    predicted = post(client, "/predict", {"tasks": TASKS, "events": events}).json()
    counts = {side: shared[side]["count"] for side in ("original", "medtpe")}
    assert predicted["shared_tokens"] == counts
    for result, answer in zip(results, predicted["results"], strict=True):
        fed = shared["medtpe"]["ids"] + result["tail"]["medtpe"]["ids"]
        assert answer["receipt"]["receipt"]["prompt_ids_sha256"] == prompt_ids_digest(fed)
        assert answer["tokens"]["original"] == result["total"]["original"]
        assert answer["events"] == result["events"]


def test_a_task_is_answered_as_before_and_one_of_tasks_is_its_prompt(client: TestClient) -> None:
    body = {"task": "phenotyping", "events": synthetic_events(32, 30)}
    single = tokenized(client, body)
    assert set(single) == {
        "original",
        "medtpe",
        "compression_rate",
        "merged",
        "events",
        "max_input_tokens",
    }
    del body["task"]
    out = tokenized(client, body | {"tasks": ["phenotyping"]})
    (result,) = out["results"]
    for side in ("original", "medtpe"):
        assert out["shared"][side]["ids"] + result["tail"][side]["ids"] == single[side]["ids"]
    assert result["events"] == single["events"]


def test_a_record_cut_to_the_budget_is_rendered_once_for_every_task(client: TestClient) -> None:
    tasks = ["readmission_30d", "icu_mortality"]
    events = synthetic_events(33, 300)
    out = tokenized(client, {"tasks": tasks, "events": events, "max_input_tokens": 700})
    kept = {r["events"]["kept"] for r in out["results"]}
    assert len(kept) == 1 and kept.pop() < 300
    assert out["max_input_tokens"] == 700
    assert all(r["total"]["original"] <= 700 for r in out["results"])
    # the tails are the tasks' own text, short beside the record read once
    tails = [r["tail"]["medtpe"]["count"] for r in out["results"]]
    assert max(tails) < out["shared"]["medtpe"]["count"] / 4


@pytest.mark.parametrize(
    ("change", "loc", "error"),
    [
        *BAD_TASK_CHOICES,
        ({}, ["body", "task"], "missing"),
        ({"tasks": TASKS[:2], "max_input_tokens": 1025}, ["body", "max_input_tokens"], None),
    ],
)
def test_bad_tasks_are_422_naming_the_field(
    client: TestClient, change: dict, loc: list, error: str | None
) -> None:
    assert len(TASKS * 3) > MAX_TASKS_PER_RECORD
    answer = post(client, "/tokenize", {"events": synthetic_events(34, 10), **change})
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"][0]
    assert detail["loc"] == loc, detail
    assert error is None or detail["type"] == error, detail


def test_tasks_belong_to_a_record_not_to_a_text(client: TestClient) -> None:
    answer = post(client, "/tokenize", {"text": "Heart rate 88", "tasks": TASKS[:2]})
    assert answer.status_code == 422
    (detail,) = answer.json()["detail"]
    assert detail["loc"] == ["body", "tasks"] and "`events`" in detail["msg"]
