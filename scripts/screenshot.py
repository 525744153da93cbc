"""Regenerate docs/lab.png: start the lab on a free port, open it in headless Chromium, shoot.

    .venv/bin/python scripts/screenshot.py [--out docs/lab.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.browser_support import CHROMIUM_ARGS, chromium_path, running_lab


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/lab.png")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with running_lab() as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1700})
        page.goto(url)
        page.wait_for_selector("body[data-ready='1']", timeout=60_000)
        page.wait_for_function("document.querySelector('#chart-paging .main-svg') !== null",
                               timeout=60_000)
        page.screenshot(path=args.out, full_page=False)
        browser.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
