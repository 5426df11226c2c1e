"""Screenshot of the compression page of a running service, as its user sees it: a bundled
example tokenized and predicted (both modes when the instance serves them), a MedTPE token
hovered. Headless Chromium (Debian's `chromium` and `chromium-driver`: `make deps-system`).

    MEDTPE_API_KEYS=demo MEDTPE_COMPARE_MODES=true \\
      MEDTPE_CODES_DIR=../shared/data/mimic-iv-demo-meds .venv/bin/medtpe serve --port 8000 &
    .venv/bin/python -m tools.scripts.ui_screenshot --url http://127.0.0.1:8000 --key demo
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.support.ui_page import UiPage, chromium

OUT = Path(__file__).resolve().parents[2] / "docs" / "img" / "ui.png"


def main() -> None:
    """Drive the page and write the PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the service")
    parser.add_argument("--key", default="", help="an API key of the service (if it needs one)")
    parser.add_argument("--example", type=int, default=0, help="bundled example (0: the first)")
    parser.add_argument("--budget", default=None, help="an input budget the page offers")
    parser.add_argument("--hover", type=int, default=40, help="the MedTPE token to point at")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1640)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with chromium(args.width, args.height) as driver:
        page = UiPage(driver, args.url)
        page.open("/")
        page.enter_key(args.key)
        page.pick_example(args.example)
        if args.budget is not None:
            page.select("budget").select_by_value(args.budget)
        both = page.element("both-modes")
        if both.is_displayed():
            both.click()
        page.tokenize()
        page.predict()
        if page.error_shown():
            raise SystemExit(f"the page shows an error: {page.element('error').text}")
        merged = page.driver.find_elements("css selector", "#medtpe-tokens span.merged")
        page.hover(merged[min(args.hover, len(merged) - 1)])
        driver.save_screenshot(str(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
