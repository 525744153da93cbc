"""servelab serve under open-loop Poisson load, with features from SQLite and Redis.

Starts the demo (example fraud repo, trained model) once, serves it with each online
store, and for each rate prints: achieved rate, mean batch (the server's inference
count over execution count), p50/p99 end to end from the client's intended send
times, the online feature fetch p50/p99 per batch (the gateway's histogram), and the
gateway's own time per request (end to end minus queue minus compute).
Then a short saturation run: the rate at which the gateway stops keeping up.

    python bench/bench_serve.py [--rates 250,500,1000,1500] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.services import free_port, redis_server

from servelab.gateway.cli import build_demo
from servelab.measure.loadgen import http_request, poisson_offsets, run_open_loop


@contextlib.contextmanager
def serve(repo: Path, model: Path, store: str, extra: list[str]) -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "servelab", "serve", "--model",
                             f"fraud={model}", "--feature-repo", str(repo),
                             "--feature-service", "fraud_model_v1", "--store", store,
                             "--port", str(port), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200:
                    break
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def stats(port: int) -> dict[str, float]:
    s = httpx.get(f"http://127.0.0.1:{port}/v2/models/fraud/stats").json()["model_stats"][0]
    inf = s["inference_stats"]
    return {"inferences": s["inference_count"], "executions": s["execution_count"],
            "queue_ns": inf["queue"]["ns"], "success": inf["success"]["count"],
            "compute_ns": sum(inf[k]["ns"] for k in ("compute_input", "compute_infer",
                                                     "compute_output"))}


def histogram_quantiles(text: str, name: str, qs: tuple[float, ...]) -> list[float]:
    """Quantiles (ms) from a Prometheus histogram's cumulative buckets (linear within)."""
    rows = [(float(le), float(v)) for le, v in re.findall(
        rf'^{name}_bucket\{{le="([^"]+)",[^}}]*\}} (\S+)$', text, re.M) if le != "+Inf"]
    rows.sort()
    total = rows[-1][1] if rows else 0
    out = []
    for q in qs:
        target, prev_le, prev_c = q * total, 0.0, 0.0
        value = float("nan")
        for le, c in rows:
            if c >= target and total:
                frac = (target - prev_c) / (c - prev_c) if c > prev_c else 1.0
                value = (prev_le + (le - prev_le) * frac) * 1e3
                break
            prev_le, prev_c = le, c
        out.append(value)
    return out


def body(users: int, merchants: int, rng: np.random.Generator, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        u, m = int(rng.integers(1, users + 1)), int(rng.integers(1, merchants + 1))
        out.append(json.dumps({"inputs": [
            {"name": "user_id", "datatype": "INT64", "shape": [1, 1], "data": [u]},
            {"name": "merchant_id", "datatype": "INT64", "shape": [1, 1], "data": [m]}]}
        ).encode())
    return out


def run_rate(port: int, rate: float, seconds: float, bodies: list[bytes]) -> dict[str, float]:
    reqs = [http_request("127.0.0.1", port, "/v2/models/fraud/infer", b) for b in bodies]
    before = stats(port)
    res = asyncio.run(run_open_loop("127.0.0.1", port, reqs,
                                    poisson_offsets(rate, int(rate * seconds), seed=int(rate))))
    after = stats(port)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    s = res.summary()
    d = {k: after[k] - before[k] for k in after}
    ok = max(d["success"], 1)
    queue_ms = d["queue_ns"] / ok / 1e6
    compute_ms = d["compute_ns"] / ok / 1e6
    f50, f99 = histogram_quantiles(text, "servelab_feature_fetch_seconds", (0.5, 0.99))
    return {"offered": rate, "achieved": s["achieved_per_s"], "errors": s["errors"],
            "mean_batch": d["inferences"] / max(d["executions"], 1),
            "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "fetch_p50_ms": f50,
            "fetch_p99_ms": f99, "queue_ms": queue_ms, "compute_ms": compute_ms,
            "overhead_ms": s["mean_ms"] - queue_ms - compute_ms,
            "behind_p99_ms": s["behind_p99_ms"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rates", default="250,500,1000,1500")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--saturation", default="2000,2500,3000,4000")
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    work = Path(tempfile.mkdtemp(prefix="servelab-bench-serve-"))
    repo, _service, model = build_demo(work / "repo")
    bodies = body(2000, 200, np.random.default_rng(1), 4096)
    print(f"{'store':<7} {'offered':>8} {'achieved':>9} {'err':>5} {'batch':>6} {'p50 ms':>8} "
          f"{'p99 ms':>8} {'fetch p50':>10} {'fetch p99':>10} {'queue':>7} {'compute':>8} "
          f"{'gateway':>8}")
    with redis_server() as url:
        stores = ["sqlite"] + (["redis"] if url else [])
        if url:
            toml = (repo / "feature_repo.toml").read_text()
            (repo / "feature_repo.toml").write_text(
                toml.replace('online = "sqlite"', f'online = "sqlite"\nredis_url = "{url}"'))
            from servelab.features.definitions import load_repo
            from servelab.features.materialization import materialize
            from servelab.features.online import open_store

            r = load_repo(repo)
            s = open_store(r, "redis")
            s.apply(list(r.views.values()))
            materialize(r, s)
            s.close()
        for store in stores:
            with serve(repo, model, store, []) as port:
                run_rate(port, 200, 2, bodies)  # warm-up
                for rate in rates + [float(x) for x in args.saturation.split(",")]:
                    row = run_rate(port, rate, args.seconds, bodies)
                    print(f"{store:<7} {row['offered']:>8.0f} {row['achieved']:>9.0f} "
                          f"{row['errors']:>5.0f} {row['mean_batch']:>6.2f} "
                          f"{row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} "
                          f"{row['fetch_p50_ms']:>10.3f} {row['fetch_p99_ms']:>10.3f} "
                          f"{row['queue_ms']:>7.2f} {row['compute_ms']:>8.3f} "
                          f"{row['overhead_ms']:>8.2f}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print("\nbatching: the seed's (max_batch_size 32, max_queue_delay 2,000 us, 1 instance); "
          "load and gateway share this machine's cores.")


if __name__ == "__main__":
    main()
