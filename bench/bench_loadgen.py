"""The load generator's own ceiling on this machine, beside a plain httpx client.

Both clients send open-loop Poisson load at rising rates to a stub v2 server that
answers at once (tests/stub_v2.py, --delay-ms 0), each rate for `--seconds`. For each
they print what was served, how late requests left against their intended times
(the timing error), and p50/p99; a client's ceiling is the highest rate it sustained
(every request answered, p99 late < 5 ms). The ratio of the ceilings is printed.
The httpx client is what a user might write first: asyncio.sleep to each intended
time, httpx.AsyncClient with a connection pool. Above its ceiling a client, not the
server, limits what `servelab load` or `validate` can measure.

    python bench/bench_loadgen.py [--rates 500,1000,2000,4000,6000] [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.services import free_port, server_process  # noqa: E402

from servelab.measure.loadgen import (  # noqa: E402
    LoadResult,
    http_request,
    paused_gc,
    poisson_offsets,
    run_open_loop,
)

BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                               "data": [0.0, 1.0, 2.0, 3.0]}]}).encode()


async def httpx_open_loop(url: str, offsets: np.ndarray) -> LoadResult:
    n = offsets.size
    intended = np.rint(offsets * 1e9).astype(np.int64)
    sent, done, status = (np.zeros(n, np.int64) for _ in range(3))
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        t0 = time.monotonic_ns()

        async def one(i: int) -> None:
            sent[i] = time.monotonic_ns() - t0
            try:
                r = await client.post(url, content=BODY,
                                      headers={"Content-Type": "application/json"})
                status[i] = r.status_code
            except httpx.HTTPError:
                status[i] = 0
            done[i] = time.monotonic_ns() - t0

        tasks = []
        with paused_gc():  # the same advantage servelab's client takes
            for i in range(n):
                delay = (intended[i] - (time.monotonic_ns() - t0)) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(one(i)))
            await asyncio.gather(*tasks)
    return LoadResult(intended, sent, done, status, {})


def row(name: str, rate: float, res: LoadResult) -> dict[str, float | str | bool]:
    s = res.summary()
    late = res.behind_ms
    # Sustained: every request answered, and they left on time (p99 under 5 ms late).
    ok = s["ok"] == s["requests"] and float(np.percentile(late, 99)) < 5.0
    return {"client": name, "offered": rate, "served": s["achieved_per_s"],
            "late_p50_ms": float(np.percentile(late, 50)),
            "late_p99_ms": float(np.percentile(late, 99)), "p50_ms": s["p50_ms"],
            "p99_ms": s["p99_ms"], "sustained": ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="500,1000,2000,3000,4000,6000")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    rates = [float(x) for x in args.rates.split(",")]
    port = free_port()
    stub = [sys.executable, str(ROOT / "tests" / "stub_v2.py"), str(port), "--delay-ms", "0"]
    url = f"http://127.0.0.1:{port}/v2/models/stub/infer"
    rows = []
    with server_process(stub, f"http://127.0.0.1:{port}/v2/health/ready"):
        req = [http_request("127.0.0.1", port, "/v2/models/stub/infer", BODY)]
        failed: set[str] = set()
        for k, rate in enumerate(rates):
            offsets = poisson_offsets(rate, max(int(rate * args.seconds), 50), k)
            budget = 3 * args.seconds + 10
            runs = {"servelab": lambda o=offsets: run_open_loop("127.0.0.1", port, req, o),
                    "httpx": lambda o=offsets: httpx_open_loop(url, o)}
            for name, run in runs.items():
                if name in failed:  # it could not keep a lower rate: skip the rest
                    continue
                try:
                    res = asyncio.run(asyncio.wait_for(run(), budget))
                except TimeoutError:
                    rows.append({"client": name, "offered": rate, "served": float("nan"),
                                 "late_p50_ms": float("nan"), "late_p99_ms": float("nan"),
                                 "p50_ms": float("nan"), "p99_ms": float("nan"),
                                 "sustained": False})
                    failed.add(name)
                    continue
                rows.append(row(name, rate, res))
                if not rows[-1]["sustained"]:
                    failed.add(name)
    print(f"{'client':9} {'offered/s':>9} {'served/s':>9} {'late p50':>9} {'late p99':>9} "
          f"{'p50 ms':>7} {'p99 ms':>7}  sustained")
    for r in rows:
        print(f"{r['client']:9} {r['offered']:9.0f} {r['served']:9.0f} "
              f"{r['late_p50_ms']:8.2f}ms {r['late_p99_ms']:8.2f}ms {r['p50_ms']:7.2f} "
              f"{r['p99_ms']:7.2f}  {'yes' if r['sustained'] else 'no'}")
    ceiling = {}
    for name in ("servelab", "httpx"):
        ok = [float(r["offered"]) for r in rows if r["client"] == name and r["sustained"]]
        ceiling[name] = max(ok) if ok else 0.0
    print(f"\nceiling (highest rate sustained): servelab {ceiling['servelab']:.0f}/s, "
          f"httpx {ceiling['httpx']:.0f}/s", end="")
    if ceiling["httpx"] > 0:
        print(f"; ratio {ceiling['servelab'] / ceiling['httpx']:.2f}x")
    else:
        print()
    if ceiling["servelab"] == max(rates):
        print("(servelab sustained the highest rate tried: its ceiling is above it)")


if __name__ == "__main__":
    main()
