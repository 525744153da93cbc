"""Start the lab on a free loopback port and find Debian's Chromium, for tests and scripts."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator

from servelab.measure.process import free_port

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


@contextlib.contextmanager
def running_lab(timeout_s: float = 60.0) -> Iterator[str]:
    """`servelab lab` in a subprocess, as a user starts it; yields its URL."""
    from tests.services import server_process

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with server_process([sys.executable, "-m", "servelab", "lab", "--port", str(port)],
                        url + "/api/meta", timeout_s):
        yield url


# The page's first read-out: ms since navigation started, as window.__first.
FIRST_READOUT_JS = """
new MutationObserver(() => {
  const o = document.querySelector('#out-p99');
  if (o && o.textContent.includes('ms') && window.__first === undefined)
    window.__first = performance.now();  // ms since navigation started
}).observe(document, { subtree: true, childList: true, characterData: true });
"""

# The page has finished starting: its other sections answered, plotly.js drew the charts,
# the paging replay (seconds of CPU in a worker process) and the LLM section's rate sweep
# (asked for once the page rests) are done.
SETTLED_JS = ("document.body.dataset.llmReady === '1' && "
              "document.body.dataset.driftReady === '1' && "
              "document.querySelector('#chart-qps .main-svg') !== null && "
              "document.querySelector('#paging-status').textContent === '' && "
              "document.querySelector('#llm-sweep-status').textContent === ''")


def first_readout_ms(browser, url: str) -> float:  # type: ignore[no-untyped-def]
    """One visit in a new page: ms from navigation to the first read-out; the page is
    left to settle (so the next visit does not share the server with its start-up)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.add_init_script(FIRST_READOUT_JS)
    page.goto(url)
    page.wait_for_function("window.__first !== undefined", timeout=60_000)
    ms = float(page.evaluate("window.__first"))
    page.wait_for_function(SETTLED_JS, timeout=60_000)
    page.close()
    return ms


# Time from a control's input event to the read-outs showing its answer, measured in the
# page: the control gets its new value and its event; a MutationObserver takes the moment
# the page renders the answer (the read-outs' `data-rendered` count moves: a read-out whose
# figure is unchanged keeps its text), then the next animation frame (the paint).
# Event "key" is a keyboard step: input and change in one task, as a browser fires them
# for an arrow key; its time runs to the *final* read-outs (not a preview's) painted.
MEASURE_JS = """
async ([control, value, event]) => {
  const el = document.querySelector(control);
  const results = document.querySelector('#results');
  const before = results.dataset.rendered;
  const final = event === 'key';
  return await new Promise((resolve) => {
    const t0 = performance.now();
    const obs = new MutationObserver(() => {
      if (results.dataset.rendered === before) return;
      if (final && results.dataset.preview === '1') return;
      obs.disconnect();
      requestAnimationFrame(() => resolve(performance.now() - t0));
    });
    obs.observe(results, { attributes: true, attributeFilter: ['data-rendered'] });
    el.value = String(value);
    for (const name of final ? ['input', 'change'] : [event]) {
      el.dispatchEvent(new Event(name, { bubbles: true }));
    }
    setTimeout(() => { obs.disconnect(); resolve(-1); }, 20000);
  });
}
"""

# (label, control selector, event, values)
MOVES = [
    ("QPS", "#c-workload-qps-range", "input", [2000 + 100 * i for i in range(1, 26)]),
    ("batch window", "#c-batching-max-queue-delay-microseconds-range", "input",
     [2000 + 300 * i for i in range(1, 26)]),
    ("max batch size", "#c-batching-max-batch-size-range", "input", [2 + i for i in range(25)]),
    ("context", "#c-llm-context-tokens-range", "input", [4096 + 512 * i for i in range(1, 26)]),
    ("KV dtype", "#c-llm-kv-dtype", "change", ["fp8", "auto"] * 12 + ["fp8"]),
]


# The same sliders stepped as a keyboard steps them, timed to the final figures.
KEY_MOVES = [(label, control, "key", values) for label, control, event, values in MOVES
             if event == "input"]


def idle(page) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_function("document.querySelector('#status').textContent === ''",
                           timeout=60_000)


def time_moves(page, moves: list[tuple[str, str, str, list[object]]] = MOVES
               ) -> dict[str, list[float]]:  # type: ignore[no-untyped-def]
    """Each move's time in ms (-1: no answer rendered within 20 s)."""
    out: dict[str, list[float]] = {}
    for label, control, event, values in moves:
        times = []
        for v in values:
            idle(page)
            page.wait_for_timeout(30)
            times.append(float(page.evaluate(MEASURE_JS, [control, v, event])))
        out[label] = times
    return out
