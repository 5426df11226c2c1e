"""The compression page in a real browser (headless Chromium, Selenium, Debian's chromium-driver)
against the session's service on the real vLLM engine: it loads, tokenizes a bundled record with
as many coloured tokens as the API counts, shows a prediction and the API's own error for a bad
record, and leaves nothing of the record in the browser's storage or the service's log. The
side-by-side view of both modes runs on an instance serving both (instant engines: the page is
what is tested there)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver

from service.ui import STATIC_DIR
from tests.support.service_support import (
    SERVICE_API_KEY,
    ServiceProcess,
    instant_settings,
    served_in_thread,
)
from tests.support.ui_page import UiPage, browser_missing, chromium

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing())),
]

EXAMPLE = json.loads((STATIC_DIR / "examples" / "examples.json").read_text())["examples"][0]
AUTH = {"Authorization": f"Bearer {SERVICE_API_KEY}"}


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with chromium() as driver:
        yield driver


def example_body() -> dict:
    """The first bundled example as the page sends it to `/tokenize`."""
    return {
        "events": EXAMPLE["events"],
        "prediction_time": EXAMPLE["prediction_time"],
        "task": EXAMPLE["task"],
    }


@pytest.mark.slow
def test_the_page_on_the_real_service(
    browser: webdriver.Chrome, service_server: ServiceProcess
) -> None:
    page = UiPage(browser, service_server.url)
    page.open("/")
    assert browser.current_url == service_server.url + "/ui/"
    assert "medtpe mode" in page.element("service-status").text
    page.enter_key(SERVICE_API_KEY)
    page.pick_example(0)

    page.tokenize()
    assert not page.error_shown(), page.element("error").text
    api = httpx.post(service_server.url + "/tokenize", json=example_body(), headers=AUTH).json()
    for side in ("original", "medtpe"):
        assert page.count(side) == api[side]["count"]
        shown = [span.text for span in page.tokens(side)[:40]]
        assert shown == [t.replace("\n", "↵") for t in api[side]["tokens"][:40]]
    merged_ids = {m["id"] for m in api["merged"]}
    assert page.count("medtpe", "span.merged") == sum(i in merged_ids for i in api["medtpe"]["ids"])
    assert page.element("original-total").text == str(api["original"]["count"])
    assert page.element("compression").text == f"{100 * api['compression_rate']:.1f} %"
    left_out = api["events"]["total"] - api["events"]["kept"]
    assert f"left out {left_out} older events" in page.element("events-note").text
    merged = page.tokens("medtpe")[api["medtpe"]["ids"].index(api["merged"][0]["id"])]
    assert "replaces the pair" in page.hover(merged)

    page.predict()
    assert not page.error_shown(), page.element("error").text
    assert page.element("prediction").find_element("css selector", ".answer").text in (
        "yes",
        "no",
        "no answer",
    )
    p_yes = float(page.element("prediction").find_element("css selector", ".p-yes").text)
    assert 0.0 <= p_yes <= 1.0

    bad = [dict(EXAMPLE["events"][0]), {"subject_id": 1, "time": None}]
    page.paste_record(json.dumps(bad))
    page.tokenize()
    assert page.error_shown()
    stated = httpx.post(
        service_server.url + "/tokenize",
        json={"events": bad, "task": EXAMPLE["task"]},
        headers=AUTH,
    ).json()
    shown = page.element("error").text
    assert "422" in shown and stated["error"] in shown
    for item in stated["detail"]:
        assert " › ".join(map(str, item["loc"])) in shown and item["msg"] in shown

    kept = page.storage()
    assert kept["local"] == kept["session"] == kept["databases"] == kept["caches"] == []
    assert kept["cookie"] == "" and kept["url"] == service_server.url + "/ui/"
    log = service_server.log()
    for secret in (str(EXAMPLE["events"][0]["subject_id"]), EXAMPLE["prediction_time"]):
        assert secret not in log
    assert SERVICE_API_KEY not in log


@pytest.fixture(scope="module")
def comparing_url(service_files: tuple[Path, Path]) -> Iterator[str]:
    """An instance serving both modes, with the test service's keys (two instant engines)."""
    with served_in_thread(instant_settings(service_files, compare_modes=True)) as url:
        yield url


def test_both_modes_side_by_side_and_a_missing_key(
    browser: webdriver.Chrome, comparing_url: str
) -> None:
    page = UiPage(browser, comparing_url)
    page.open("/ui")
    page.pick_example(2)
    page.predict()
    assert page.error_shown() and "401" in page.element("error").text  # no key typed yet

    page.enter_key(SERVICE_API_KEY)
    page.element("both-modes").click()
    page.predict()
    assert not page.error_shown(), page.element("error").text
    modes = [
        c.text
        for c in browser.find_elements("css selector", "#prediction-table tr")[0].find_elements(
            "css selector", "td"
        )
    ]
    assert modes == ["original", "medtpe"]
