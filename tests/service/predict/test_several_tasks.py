"""`/predict` and `/predict/batch` with `tasks`: one record read once for several tasks, on the
instant engine in-process (its prefix cache counts what vLLM's would reuse). Each task gets what
it gets asked alone, its own signed ledger row, and the tasks after the first read the record
from the engine's cache; admission counts the call at that cost; bad `tasks` are 422s naming the
field."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from medtpe.core.tasks import list_tasks
from medtpe.inference.engines.instant import PREFIX_BLOCK_TOKENS
from medtpe.service.plumbing.limits import tasks_cost
from medtpe.service.predict.task_choice import MAX_TASKS_PER_RECORD
from tests.service.test_ledger_doors import recorded_row
from tests.support.bad_requests import BAD_TASK_CHOICES
from tests.support.service_support import (
    AUTH,
    instant_client,
    instant_settings,
    metric_value,
    post,
    record,
    synthetic_events,
)

pytestmark = [pytest.mark.timeout(300)]

TASKS = list_tasks()
PROBABILITIES = {"return_probabilities": True}
SHORT = 12
"""Events of a record every task's prompt holds whole at the test budget (1,024 tokens)."""


@pytest.fixture(scope="module")
def ledger_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('ledger') / 'ledger.sqlite3'}"


@pytest.fixture(scope="module")
def client(service_files: tuple[Path, Path], ledger_file: str) -> Iterator[TestClient]:
    with instant_client(instant_settings(service_files, ledger_url=ledger_file)) as client:
        yield client


def asked(subject_id: int, tasks: list[str], n_events: int = 30, **extra: Any) -> dict:
    """A request for `tasks` about a synthetic record, probabilities asked for."""
    events = synthetic_events(subject_id, n_events)
    return {"tasks": tasks, "events": events, "options": PROBABILITIES, **extra}


def answer_of(result: dict) -> tuple:
    """What a task's answer is made of: task, answer, p, token counts, prompt ids' digest."""
    receipt = result["receipt"]["receipt"]
    tokens = result["tokens"]
    prompt = (tokens["original"], tokens["medtpe"], receipt["prompt_ids_sha256"])
    return result["task"], result["prediction"], result["probabilities"], prompt


def test_four_tasks_answer_as_each_alone_with_the_record_read_once(
    client: TestClient, ledger_file: str
) -> None:
    engine = client.app.state.service.engine
    answer = post(client, "/predict", asked(21, TASKS, n_events=SHORT))
    assert answer.status_code == 200, answer.text
    prefilled = list(engine.prefills)
    body = answer.json()
    results = body["results"]
    assert [r["task"] for r in results] == TASKS
    alone = []
    for task in TASKS:
        single = post(
            client, "/predict", record(21, SHORT, task=task, options=PROBABILITIES)
        ).json()
        assert "results" not in single and single["events"]["kept"] == single["events"]["total"]
        alone.append(single)
    # the whole record fits either way: each task's prompt is the one it gets asked alone
    assert all(r["events"] == a["events"] for r, a in zip(results, alone, strict=True))
    assert [answer_of(r) for r in results] == [answer_of(a) for a in alone]
    # the record and what precedes it prefilled once (a single task prefills nothing), then
    # read from the cache by every task
    shared = body["shared_tokens"]["medtpe"]
    assert 0 < shared < min(r["tokens"]["medtpe"] for r in results)
    assert engine.prefills == prefilled and len(prefilled[-1]) == shared
    reusable = shared // PREFIX_BLOCK_TOKENS * PREFIX_BLOCK_TOKENS
    assert reusable > 0
    assert [r["cached_tokens"] for r in results] == [reusable] * 4
    # each task its own row, signed, on the record whose digest the answer names once
    rows = [recorded_row(client, ledger_file, result) for result in results]
    assert len({row.prediction_id for row in rows}) == 4
    assert {r["receipt"]["receipt"]["record_sha256"] for r in results} == {body["record_sha256"]}
    assert [row.task for row in rows] == TASKS and {row.door for row in rows} == {"predict"}


def test_a_record_cut_to_the_budget_answers_each_task_alike_in_any_order(
    client: TestClient,
) -> None:
    tasks = ["readmission_30d", "icu_mortality", "phenotyping"]
    first = post(client, "/predict", asked(22, tasks, n_events=400)).json()["results"]
    again = post(client, "/predict", asked(22, tasks[::-1], n_events=400)).json()["results"]
    assert first[0]["events"]["kept"] < first[0]["events"]["total"]
    assert [answer_of(r) for r in first] == [answer_of(r) for r in again[::-1]]
    # asked again, the whole prompt but its last block is in the engine's cache
    assert all(r["cached_tokens"] > 0 for r in again)


def test_a_batch_item_asks_several_tasks(client: TestClient) -> None:
    items = [asked(23, TASKS[:2]), record(24)]
    answer = post(client, "/predict/batch", {"records": items})
    assert answer.status_code == 200, answer.text
    several, single = answer.json()["results"]
    assert [r["task"] for r in several["results"]] == TASKS[:2]
    assert single["task"] == "icu_mortality" and "cached_tokens" not in single
    assert several["results"][1]["cached_tokens"] > 0
    receipts = [r["receipt"]["receipt"] for r in several["results"]]
    assert {r["door"] for r in receipts} == {"predict_batch"}


def test_the_metrics_count_the_reused_tokens_and_which_part_was_shared(
    client: TestClient,
) -> None:
    def figures() -> tuple[float, float, float]:
        text = client.get("/metrics", headers=AUTH).text
        count = "medtpe_generation_latency_seconds_count"
        return (
            metric_value(text, "medtpe_prefill_reused_tokens_total", door="predict"),
            metric_value(text, count, task="phenotyping", prefix="reused"),
            metric_value(text, count, task="icu_mortality", prefix="reused"),
        )

    before = figures()
    answer = post(client, "/predict", asked(25, ["phenotyping", "icu_mortality"])).json()
    after = figures()
    assert after[0] - before[0] == sum(r["cached_tokens"] for r in answer["results"]) > 0
    assert (after[1] - before[1], after[2] - before[2]) == (1, 1)
    text = client.get("/metrics", headers=AUTH).text
    latency = "medtpe_request_latency_seconds_count"
    assert metric_value(text, latency, endpoint="predict", task="mixed") >= 1


@pytest.mark.parametrize(("change", "loc", "error"), BAD_TASK_CHOICES)
def test_bad_tasks_are_422_naming_the_field(
    client: TestClient, change: dict, loc: list, error: str
) -> None:
    assert len(TASKS * 3) > MAX_TASKS_PER_RECORD
    body = {"events": synthetic_events(26, 10), **change}
    for path, sent, where in (
        ("/predict", body, loc),
        ("/predict/batch", {"records": [record(27), body]}, ["body", "records", 1, *loc[1:]]),
    ):
        answer = post(client, path, sent)
        assert answer.status_code == 422, answer.text
        detail = answer.json()["detail"][0]
        assert (detail["loc"], detail["type"]) == (where, error), detail
        assert "tasks" in detail["msg"] or error in ("too_short", "too_long", "list_type")


def test_neither_task_nor_tasks_is_422_at_task(client: TestClient) -> None:
    answer = post(client, "/predict", {"events": synthetic_events(28, 10)})
    assert answer.status_code == 422
    detail = answer.json()["detail"][0]
    assert (detail["loc"], detail["type"]) == (["body", "task"], "missing")
    assert "`tasks`" in detail["msg"]


def test_admission_counts_the_shared_record_once(service_files: tuple[Path, Path]) -> None:
    """A two-task call held by the engine holds admission at its first prompt plus its second
    prompt's share past the record, not at two prompts; more tasks than admission holds at once
    are refused before any work."""
    settings = instant_settings(service_files, max_concurrency=1, queue_limit=1)
    with instant_client(settings, delay_s=60) as client:
        admission = client.app.state.service.admission
        engine = client.app.state.service.engine
        called: dict[str, httpx.Response] = {}
        request = asked(29, ["icu_mortality", "readmission_30d"])
        thread = threading.Thread(target=lambda: called.update(r=post(client, "/predict", request)))
        thread.start()
        try:
            while len(engine.prompts) < 2:  # the warm-up's, then the first task's
                threading.Event().wait(0.02)
            held = admission.admitted
        finally:
            engine.release()
            thread.join(60)
        body = called["r"].json()
        lengths = [r["tokens"]["medtpe"] for r in body["results"]]
        shared = body["shared_tokens"]["medtpe"]
        assert held == tasks_cost(lengths, shared) == 1 + Fraction(lengths[1] - shared, lengths[1])
        assert 1 < held < 2 and admission.admitted == 0
        refused = post(client, "/predict", asked(30, TASKS[:3]))
        assert refused.status_code == 422
        assert refused.json()["detail"][0]["loc"] == ["body", "tasks"]
