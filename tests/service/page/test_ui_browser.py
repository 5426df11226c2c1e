"""The compression page in a real browser (headless Chromium, Selenium, Debian's chromium-driver)
against the session's service on the real vLLM engine: it loads, tokenizes a bundled record with
as many coloured tokens as the API counts, shows a prediction and the API's own error for a bad
record, and leaves nothing of the record in the browser's storage or the service's log (the
side-by-side view of both modes: tests/service/page/test_ui_api.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.common.by import By

from medtpe.service.page.routes import STATIC_DIR
from tests.support.service_support import (
    AUTH,
    SERVICE_API_KEY,
    ServiceProcess,
)
from tests.support.ui_page import UiPage, browser_missing, chromium

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing())),
]

EXAMPLE = json.loads((STATIC_DIR / "examples" / "examples.json").read_text())["examples"][0]


def example_body() -> dict:
    """The first bundled example as the page sends it to `/tokenize`."""
    return {
        "events": EXAMPLE["events"],
        "prediction_time": EXAMPLE["prediction_time"],
        "task": EXAMPLE["task"],
    }


@pytest.fixture
def page(service_server: ServiceProcess) -> Iterator[UiPage]:
    """The page of the session's service in a fresh headless Chromium."""
    with chromium() as driver:
        yield UiPage(driver, service_server.url)


@pytest.mark.slow
def test_the_page_on_the_real_service(page: UiPage, service_server: ServiceProcess) -> None:
    page.open("/")
    assert page.driver.current_url == service_server.url + "/ui/"
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
    answer = page.element("prediction").find_element(By.CSS_SELECTOR, ".answer").text
    assert answer in ("yes", "no", "no answer")
    p_yes = float(page.element("prediction").find_element(By.CSS_SELECTOR, ".p-yes").text)
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
