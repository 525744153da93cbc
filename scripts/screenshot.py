"""Screenshots of the lab for the README: desktop (docs/lab.png) and phone width
(docs/lab-phone.png), in Debian's headless Chromium.

    .venv/bin/python scripts/screenshot.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402
from tests.browser_support import CHROMIUM_ARGS, chromium_path, running_lab  # noqa: E402

READY = ("document.body.dataset.llmReady === '1' && document.body.dataset.driftReady === '1'"
         " && document.querySelector('#chart-paging .main-svg') !== null"
         " && document.querySelector('#paging-status').textContent === ''")


def main() -> None:
    exe = chromium_path()
    if exe is None:
        sys.exit("chromium not installed; fix: apt-get install chromium")
    with running_lab() as url, sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        for name, size, full in (("lab.png", (1280, 1700), False),
                                 ("lab-phone.png", (390, 844), False)):
            page = b.new_page(viewport={"width": size[0], "height": size[1]})
            page.goto(url)
            page.wait_for_function(READY, timeout=120_000)
            page.wait_for_timeout(500)
            page.screenshot(path=str(ROOT / "docs" / name), full_page=full)
            page.close()
            print(f"docs/{name}")
        b.close()


if __name__ == "__main__":
    main()
