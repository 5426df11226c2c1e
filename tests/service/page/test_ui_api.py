"""What the compression page needs from the service: its files at `/ui/` (no key, no outside
source), and the public API's details it shows — each MedTPE token's pair, the record's events
and budget, a per-request budget, both modes side by side (through the API and in the page, on
an instance serving both modes with instant engines). The API tests run on the instant engine
and on the real service (`api` fixture)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from starlette.testclient import TestClient

from medtpe.service.page.routes import STATIC_DIR
from medtpe.service.settings import ServiceSettings
from tests.support.service_support import (
    AUTH,
    SERVICE_API_KEY,
    Api,
    instant_settings,
    post,
    record,
    served_in_thread,
)
from tests.support.ui_page import UiPage, browser_missing, chromium

pytestmark = [pytest.mark.timeout(900)]

EXAMPLES = json.loads((STATIC_DIR / "examples" / "examples.json").read_text())
LONG = 200
"""Events of a synthetic record that does not fit the test service's 1,024-token budget."""


def test_the_page_is_served_without_a_key_and_loads_nothing_from_elsewhere(
    instant_api: TestClient,
) -> None:
    for path in ("/", "/ui"):
        moved = instant_api.get(path, follow_redirects=False)
        assert moved.status_code in (307, 308) and moved.headers["location"].endswith("/ui/")
    page = instant_api.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "connect-src 'self'" in policy and page.headers["referrer-policy"] == "no-referrer"
    for asset in ("ui.js", "ui.css", "favicon.svg", "examples/examples.json"):
        assert instant_api.get(f"/ui/{asset}").status_code == 200, asset
    assert not re.search(r"""(src|href)=["'](https?:)?//""", page.text)  # nothing from elsewhere
    script = (STATIC_DIR / "ui.js").read_text()
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("//"))
    for keeper in ("localStorage", "sessionStorage", "cookie", "indexedDB", "history.", "caches"):
        assert keeper not in code
    assert instant_api.post("/tokenize", json={"text": "x"}).status_code == 401  # API: key


def test_the_bundled_examples_are_valid_records_with_their_attribution(
    instant_api: TestClient,
) -> None:
    assert "ODbL" in EXAMPLES["attribution"] and "MIMIC-IV" in EXAMPLES["attribution"]
    for example in EXAMPLES["examples"]:
        body = {"task": example["task"], "events": example["events"]}
        if "prediction_time" in example:
            body["prediction_time"] = example["prediction_time"]
        out = post(instant_api, "/tokenize", body)
        assert out.status_code == 200, (example["id"], out.text)
        assert out.json()["events"]["total"] == len(example["events"])


def test_tokenize_names_each_merged_token_and_the_records_window(api: Api) -> None:
    out = post(api, "/tokenize", record(41, LONG)).json()
    ids, tokens = out["medtpe"]["ids"], out["medtpe"]["tokens"]
    merged = {m["id"]: m for m in out["merged"]}
    assert merged and list(merged) == [i for i in dict.fromkeys(ids) if i in merged]
    for token_id, m in merged.items():
        assert "".join(m["pair_tokens"]) == tokens[ids.index(token_id)]
        # a half is a base token or an earlier merge (runs of up to 6 base tokens): its base
        # ids are known here when it occurs in the prompt itself
        assert len(m["pair"]) == 2 and len(m["base_ids"]) >= 2
        if all(i in merged for i in m["pair"]):
            assert (
                m["base_ids"] == merged[m["pair"][0]]["base_ids"] + merged[m["pair"][1]]["base_ids"]
            )
        assert m["reuses"]  # the test artefacts reuse evicted ids
    assert out["max_input_tokens"] == 1024 and out["original"]["count"] <= 1024
    assert 0 < out["events"]["kept"] < out["events"]["total"] == 203
    text = post(api, "/tokenize", {"text": "Heart Rate: 88 bpm"}).json()
    assert text["events"] is None and text["max_input_tokens"] is None


def test_a_request_budget_cuts_the_prompt_and_is_checked(api: Api) -> None:
    budget = 600
    tokenized = post(api, "/tokenize", record(42, LONG, max_input_tokens=budget)).json()
    assert tokenized["max_input_tokens"] == budget
    assert tokenized["original"]["count"] <= budget
    options = {"max_input_tokens": budget, "return_probabilities": True}
    predicted = post(api, "/predict", record(42, LONG, options=options)).json()
    assert predicted["tokens"]["original"] == tokenized["original"]["count"]
    assert predicted["events"] == tokenized["events"]
    assert predicted["other_mode"] is None

    too_large = post(api, "/tokenize", record(42, LONG, max_input_tokens=1025))
    assert too_large.status_code == 422
    (error,) = too_large.json()["detail"]
    assert error["loc"] == ["body", "max_input_tokens"] and "and 1024 tokens" in error["msg"]
    too_small = post(api, "/predict", record(42, LONG, options={"max_input_tokens": 10}))
    assert too_small.json()["detail"][0]["loc"] == ["body", "options", "max_input_tokens"]
    with_text = post(api, "/tokenize", {"text": "x", "max_input_tokens": budget})
    assert with_text.json()["detail"][0]["loc"] == ["body", "max_input_tokens"]


def test_the_document_states_the_budget_range(instant_api: TestClient) -> None:
    schemas = instant_api.get("/openapi.json", headers=AUTH).json()["components"]["schemas"]
    tokenize = schemas["TokenizeRequest"]["properties"]["max_input_tokens"]
    (number,) = [
        s
        for s in schemas["PredictOptions"]["properties"]["max_input_tokens"]["anyOf"]
        if s.get("type") == "integer"
    ]
    assert tokenize["maximum"] == number["maximum"] == 1024
    assert 0 < tokenize["minimum"] == number["minimum"] < 1024
    assert "MergedToken" in schemas and "other_mode" in schemas["PredictResponse"]["properties"]
    assert schemas["PredictOptions"]["properties"]["both_modes"]["enum"] == [False]


def test_both_modes_need_an_instance_that_serves_them(api: Api) -> None:
    assert api.get("/readyz").json()["modes"] == ["medtpe"]
    refused = post(api, "/predict", record(43, 20, options={"both_modes": True}))
    assert refused.status_code == 422
    (error,) = refused.json()["detail"]
    assert error["loc"] == ["body", "options", "both_modes"]
    assert "MEDTPE_COMPARE_MODES" in error["msg"]


@pytest.fixture(scope="module")
def comparing_url(service_files: tuple[Path, Path]) -> Iterator[str]:
    """An instance serving both modes, with the test service's keys (two instant engines),
    served on 127.0.0.1 for a browser too."""
    with served_in_thread(instant_settings(service_files, compare_modes=True)) as url:
        yield url


def test_both_modes_side_by_side(comparing_url: str) -> None:
    with httpx.Client(base_url=comparing_url, timeout=300) as api:
        assert api.get("/readyz").json()["modes"] == ["medtpe", "original"]
        options = {"both_modes": True, "max_input_tokens": 800}
        out = post(api, "/predict", record(44, LONG, options=options)).json()
        single = post(api, "/predict", record(44, LONG)).json()
    other = out["other_mode"]
    assert (out["model"]["mode"], other["model"]["mode"]) == ("medtpe", "original")
    assert other["tokens"] == out["tokens"] | {"generated": other["tokens"]["generated"]}
    assert other["events"] == out["events"] and other["other_mode"] is None
    assert single["other_mode"] is None


@pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))
def test_the_page_shows_both_modes_and_a_missing_key(comparing_url: str) -> None:
    with chromium() as driver:
        page = UiPage(driver, comparing_url)
        page.open("/ui")
        page.pick_example(2)
        page.predict()
        assert page.error_shown() and "401" in page.element("error").text  # no key typed yet

        page.enter_key(SERVICE_API_KEY)
        page.element("both-modes").click()
        page.predict()
        assert not page.error_shown(), page.element("error").text
        first_row = driver.find_elements(By.CSS_SELECTOR, "#prediction-table tr")[0]
        modes = [cell.text for cell in first_row.find_elements(By.CSS_SELECTOR, "td")]
    assert modes == ["original", "medtpe"]


@pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))
def test_the_page_shows_a_record_read_once_for_several_tasks(comparing_url: str) -> None:
    """Three tasks ticked from the keyboard: the shared head and record's tokens once, each
    task's tail under its name, as `/tokenize` with `tasks` gives them; then one answer each."""
    tasks = ["icu_mortality", "phenotyping", "readmission_30d"]
    example = EXAMPLES["examples"][0]
    body = {"tasks": tasks, "events": example["events"]}
    if "prediction_time" in example:
        body["prediction_time"] = example["prediction_time"]
    with httpx.Client(base_url=comparing_url, timeout=300) as api:
        out = post(api, "/tokenize", body).json()
    shared, results = out["shared"], out["results"]
    with chromium() as driver:
        page = UiPage(driver, comparing_url)
        page.open("/ui")
        page.enter_key(SERVICE_API_KEY)
        page.pick_example(0)
        page.choose_tasks(tasks)
        page.tokenize()
        assert not page.error_shown(), page.element("error").text
        for side in ("original", "medtpe"):
            assert page.count(side) == shared[side]["count"]
        blocks = driver.find_elements(By.CSS_SELECTOR, "#task-tails .task-tail")
        assert [block.get_attribute("data-task") for block in blocks] == tasks
        for block, result in zip(blocks, results, strict=True):
            for side in ("original", "medtpe"):
                spans = block.find_elements(By.CSS_SELECTOR, f".{side}-tail span.tok")
                assert [s.get_attribute("textContent") for s in spans] == [
                    t.replace("\n", "↵\n") for t in result["tail"][side]["tokens"]
                ]
        tails = sorted(r["tail"]["medtpe"]["count"] for r in results)
        each = f"{tails[0]:,}" if tails[0] == tails[-1] else f"{tails[0]:,}–{tails[-1]:,}"
        assert page.element("tasks-note").text.startswith(
            f"3 tasks: the record's {shared['medtpe']['count']:,} MedTPE tokens read once, "
            f"then {each} tokens per task"
        )
        first_tail = blocks[0].find_element(By.CSS_SELECTOR, ".medtpe-tail span.tok")
        assert f"MedTPE token {shared['medtpe']['count'] + 1} ·" in page.hover(first_tail)

        page.predict()
        assert not page.error_shown(), page.element("error").text
        first_row = driver.find_elements(By.CSS_SELECTOR, "#prediction-table tr")[0]
        assert [cell.text for cell in first_row.find_elements(By.CSS_SELECTOR, "td")] == tasks


def test_comparing_modes_needs_one_api_process() -> None:
    with pytest.raises(ValueError, match="MEDTPE_API_WORKERS=1"):
        ServiceSettings(compare_modes=True, api_workers=2)
