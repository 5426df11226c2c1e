"""The compression page (`/ui/`) driven in headless Chromium through Selenium and the Debian
`chromium-driver`: what the browser test and tools/scripts/ui_screenshot.py do with it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from selenium import webdriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

CHROMIUM = "chromium"
CHROMEDRIVER = "chromedriver"
WAIT_S = 60.0
"""Longest wait for the page to load or show something."""
ANSWER_WAIT_S = 300.0
"""Longest wait for an answer: the service's request deadline (`MEDTPE_REQUEST_TIMEOUT_S`); a
prediction on the CPU engine takes seconds, minutes on a machine loaded many times over."""

STORAGE_SCRIPT = """
const done = arguments[arguments.length - 1];
(async () => {
  const databases = indexedDB.databases ? await indexedDB.databases() : [];
  const caches_ = typeof caches === "undefined" ? [] : await caches.keys();
  const local = Object.keys(localStorage).map((k) => k + "=" + localStorage.getItem(k));
  const session = Object.keys(sessionStorage).map((k) => k + "=" + sessionStorage.getItem(k));
  done({local, session, cookie: document.cookie, databases: databases.map((d) => d.name),
        caches: caches_, url: location.href});
})();
"""
"""Everything the browser keeps for the page's origin: web storage, cookies, IndexedDB, Cache
Storage, and the address bar."""


def browser_missing() -> str | None:
    """Why the browser test cannot run here (None when Chromium and its driver are installed)."""
    missing = [name for name in (CHROMIUM, CHROMEDRIVER) if shutil.which(name) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (make deps-system installs them)"
    return None


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[webdriver.Chrome]:
    """Headless Chromium with a fresh profile (Debian's `chromium` and `chromedriver`)."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(shutil.which(CHROMIUM))
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    service = webdriver.ChromeService(executable_path=str(shutil.which(CHROMEDRIVER)))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


class UiPage:
    """The page as its user works it: key, example, tasks, budget, the buttons, what it shows."""

    def __init__(self, driver: webdriver.Chrome, base_url: str) -> None:
        self.driver = driver
        self.base_url = base_url.rstrip("/")

    def element(self, element_id: str) -> WebElement:
        """The element with this id."""
        return self.driver.find_element(By.ID, element_id)

    def wait(self, condition: Any, timeout_s: float = WAIT_S) -> Any:
        """Wait until `condition(driver)` is truthy; its value."""
        return WebDriverWait(self.driver, timeout_s).until(condition)

    def open(self, path: str = "/") -> None:
        """Load the page (from `/`, which redirects) and wait for what the service offers."""
        self.driver.get(self.base_url + path)
        self.wait(lambda _: " mode " in self.element("service-status").text)
        self.wait(lambda _: len(self.select("example").options) > 1)
        self.wait(lambda _: len(self.task_boxes()) > 0)

    def select(self, element_id: str) -> Select:
        """A drop-down of the page."""
        return Select(self.element(element_id))

    def task_boxes(self) -> list[WebElement]:
        """The task check boxes, in the service's order."""
        return self.driver.find_elements(By.CSS_SELECTOR, '#task-choices input[name="task"]')

    def choose_tasks(self, names: list[str]) -> None:
        """Tick exactly the tasks `names`, from the keyboard (focus, then the space bar)."""
        for box in self.task_boxes():
            if box.is_selected() != (box.get_attribute("value") in names):
                self.driver.execute_script("arguments[0].focus();", box)
                self.driver.switch_to.active_element.send_keys(Keys.SPACE)

    def enter_key(self, key: str) -> None:
        """Type the API key into its field."""
        self.element("api-key").send_keys(key)

    def pick_example(self, index: int) -> None:
        """Choose a bundled example (0: the first)."""
        self.select("example").select_by_index(index + 1)

    def paste_record(self, text: str) -> None:
        """Replace the record text."""
        box = self.element("record")
        box.clear()
        self.driver.execute_script("arguments[0].value = arguments[1];", box, text)

    def tokenize(self) -> None:
        """Press Tokenize and wait for the tokens or an error."""
        self._press("tokenize", "tokens")

    def predict(self) -> None:
        """Press Predict and wait for the prediction or an error."""
        self._press("predict", "prediction")

    def _press(self, button: str, result: str) -> None:
        self.driver.execute_script(
            "document.getElementById(arguments[0]).hidden = true;"
            "document.getElementById('error').hidden = true;",
            result,
        )
        self.element(button).click()
        self.wait(
            lambda _: self.element(result).is_displayed() or self.error_shown(), ANSWER_WAIT_S
        )

    def error_shown(self) -> bool:
        """Whether the error box is shown."""
        return self.element("error").is_displayed()

    def tokens(self, side: str) -> list[WebElement]:
        """The coloured token spans of one side (`original` or `medtpe`)."""
        return self.driver.find_elements(By.CSS_SELECTOR, f"#{side}-tokens span.tok")

    def count(self, side: str, css: str = "span.tok") -> int:
        """How many elements match `css` in one side's token view (counted in the page)."""
        script = "return document.querySelectorAll(arguments[0]).length;"
        return int(self.driver.execute_script(script, f"#{side}-tokens {css}"))

    def hover(self, token: WebElement) -> str:
        """Point at a token; the hover box's text."""
        ActionChains(self.driver).move_to_element(token).perform()
        self.wait(lambda _: self.element("hover").is_displayed())
        return self.element("hover").text

    def storage(self) -> dict[str, Any]:
        """What the browser keeps for the page (`STORAGE_SCRIPT`)."""
        return self.driver.execute_async_script(STORAGE_SCRIPT)
