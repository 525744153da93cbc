"""Server time per slider update in the lab, for the default (seed) scenario.

Starts `servelab lab` on a free loopback port and replays slider moves the way
the page sends them: while a slider moves, /api/update (the read-outs); when it
is let go, /api/update and /api/charts (the sweeps behind the charts) together.
Every state is new, so no cache answers. Target: p95 under 100 ms end to end.

Then, in Debian's headless Chromium (unless --no-browser): the time from navigation to
the first read-out, and from each control's input event to its read-outs rendered and
painted (25 moves each of QPS, batch window, max batch size, context and KV dtype),
measured in the page, beside the server's own time for the same kind of update.

    python bench/bench_lab.py [--moves 60] [--no-browser]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.browser_support import running_lab


def post(url: str, state: dict, preview: bool = False) -> dict:  # type: ignore[type-arg]
    req = urllib.request.Request(url, data=json.dumps({"state": state,
                                                       "preview": preview}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)  # type: ignore[no-any-return]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--moves", type=int, default=60)
    ap.add_argument("--no-browser", action="store_true")
    args = ap.parse_args()
    with running_lab() as url, ThreadPoolExecutor(2) as pool:
        with urllib.request.urlopen(url + "/api/meta") as r:
            base = json.load(r)["default_state"]
        post(url + "/api/update", base)  # warm: JIT cache load, imports
        post(url + "/api/charts", base)
        readouts, whole = [], []
        # While a slider moves, the page asks for the read-outs only, as a preview (20,000
        # requests); the same moves as full runs, for comparison.
        drag, drag_full = [], []
        for i in range(args.moves):
            state = dict(base)
            state["workload.qps"] = 1000.0 + 37 * (i + 1)
            t0 = time.perf_counter()
            post(url + "/api/update", state, preview=True)
            drag.append(time.perf_counter() - t0)
            state["workload.qps"] += 11  # a new state: no cache answers
            t0 = time.perf_counter()
            post(url + "/api/update", state)
            drag_full.append(time.perf_counter() - t0)
        # When it is let go: read-outs and charts together.
        for i in range(args.moves):
            # Alternate the two sliders a user drags most; every value is new (no cache hit).
            state = dict(base)
            if i % 2:
                state["workload.qps"] = 2000.0 + 50 * (i + 1)
            else:
                state["batching.max_queue_delay_microseconds"] = 2000 + 100 * (i + 1)
            t0 = time.perf_counter()
            upd = pool.submit(post, url + "/api/update", state)
            charts = pool.submit(post, url + "/api/charts", state)
            upd.result()
            t1 = time.perf_counter()
            charts.result()
            t2 = time.perf_counter()
            readouts.append(t1 - t0)
            whole.append(t2 - t0)
    print(f"{args.moves} slider moves on the seed scenario (200,000 simulated requests for the "
          "read-outs, 14 x 5,000 for the charts)")
    print(f"slider moving (preview read-outs):          p50 {pct(drag, 50):6.1f} ms   "
          f"p95 {pct(drag, 95):6.1f} ms   (target: p95 < 100 ms)")
    print(f"  the same moves as full runs:              p50 {pct(drag_full, 50):6.1f} ms   "
          f"p95 {pct(drag_full, 95):6.1f} ms   (preview / full p50 "
          f"{pct(drag, 50) / pct(drag_full, 50):.2f})")
    print(f"slider let go, read-outs (/api/update):    p50 {pct(readouts, 50):6.1f} ms   "
          f"p95 {pct(readouts, 95):6.1f} ms")
    print(f"slider let go, with charts (/api/charts):  p50 {pct(whole, 50):6.1f} ms   "
          f"p95 {pct(whole, 95):6.1f} ms")
    print(f"mean whole update {statistics.mean(whole) * 1e3:.1f} ms")
    if not args.no_browser:
        browser_timings(pct(drag, 50))


def browser_timings(server_preview_p50_ms: float) -> None:
    from playwright.sync_api import sync_playwright
    from tests.browser_support import (
        CHROMIUM_ARGS,
        SETTLED_JS,
        chromium_path,
        first_readout_ms,
        time_moves,
    )

    exe = chromium_path()
    if exe is None:
        print("browser: chromium not installed (apt-get install chromium), skipped")
        return
    with running_lab() as url, sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        firsts = [first_readout_ms(b, url) / 1e3 for _ in range(5)]
        print(f"\nin the browser (headless Chromium), first read-outs after navigation: p50 "
              f"{pct(firsts, 50):6.0f} ms  max {max(firsts) * 1e3:6.0f} ms  (target < 1,500)")
        page = b.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_function(SETTLED_JS, timeout=60_000)
        for label, times in time_moves(page).items():
            t = [x / 1e3 for x in times]
            print(f"  {label:15} input -> read-outs painted: p50 {pct(t, 50):6.1f} ms  p95 "
                  f"{pct(t, 95):6.1f} ms  (target p95 < 100; page / server preview p50 "
                  f"{pct(t, 50) / server_preview_p50_ms:.1f}x)")
        b.close()


if __name__ == "__main__":
    main()
