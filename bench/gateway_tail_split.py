"""Where the gateway's latency tail is at one rate: the client's percentiles beside the
batcher's own (its trace: queue and compute), and `replay-trace`'s rows on that trace,
with the measured spread of the batch times resampled and in its order.

Each run starts `servelab serve` with `--trace-file` (the demo model `validate --serve
demo` serves), warms it 3 s at 300/s, then sends one open-loop Poisson run at the rate
(the same arrivals every run: `--seed`). The trace holds both. docs/load-and-validate.md
("Where the tail is") has the figures of 2026-12-05.

    python bench/gateway_tail_split.py [--rate 1400] [--duration 5] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from servelab.gateway.demo import VALIDATION_MLP, write_mlp  # noqa: E402
from servelab.measure.load import metadata, parse_url  # noqa: E402
from servelab.measure.loadgen import LoadResult, poisson_offsets, run_open_loop  # noqa: E402
from servelab.measure.process import free_port, server_process  # noqa: E402
from servelab.measure.replay import IN_ORDER, replay  # noqa: E402
from servelab.measure.validate import http_request, random_bodies  # noqa: E402
from servelab.scenario import BatchingPolicy  # noqa: E402
from servelab.trace_file import TraceRequests, read_trace  # noqa: E402

POLICY = BatchingPolicy(max_batch_size=32, max_queue_delay_microseconds=2000)  # the demo's


def pct(a: np.ndarray) -> str:
    return " ".join(f"{np.percentile(a, p):6.2f}" for p in (50, 90, 99))


def traced_run(model: Path, rate: float, duration: float, seed: int, folder: Path
               ) -> tuple[LoadResult, TraceRequests]:
    """A fresh gateway with --trace-file serving `model`: 3 s at 300/s, then an open-loop
    Poisson run at `rate` (`seed`'s arrivals); the run's result and the whole trace."""
    port = free_port()
    trace = folder / f"trace_{seed}_{time.monotonic_ns()}.json"
    url = f"http://127.0.0.1:{port}"
    with server_process([sys.executable, "-m", "servelab", "serve", "--model", f"mlp={model}",
                         "--port", str(port), "--trace-file", str(trace)],
                        f"{url}/v2/health/ready"):
        t = parse_url(url, "mlp")
        bodies = [b for b in random_bodies(metadata(t), 256, 0) if isinstance(b, bytes)]
        reqs = [http_request(t.host, t.port, "/v2/models/mlp/infer", b) for b in bodies]
        asyncio.run(run_open_loop(t.host, t.port, reqs, poisson_offsets(300, 900, 1)))
        res = asyncio.run(run_open_loop(t.host, t.port, reqs,
                                        poisson_offsets(rate, int(rate * duration), seed)))
    return res, read_trace(sorted(folder.glob(trace.name + ".*")) or [trace])


def one_run(model: Path, rate: float, duration: float, seed: int, folder: Path) -> None:
    res, tr = traced_run(model, rate, duration, seed, folder)
    n = res.latency_ms.size
    order = np.argsort(tr.queue_ns)[-n:]  # the run's requests, after the warm-up's
    queue = (tr.start_ns[order] - tr.queue_ns[order]) / 1e6
    compute = (tr.end_ns[order] - tr.start_ns[order]) / 1e6
    print(f"  client        {pct(res.latency_ms)}   ({n} answered)")
    print(f"  queue         {pct(queue)}")
    print(f"  compute       {pct(compute)}")
    print(f"  queue+compute {pct(queue + compute)}")
    rep = replay(tr, POLICY, 1)
    m = rep["measured"]
    print(f"  replay of the whole trace (warm-up included): measured queue p90 "
          f"{m['queue_p90_ms']:.2f} ms, p99 {m['queue_p99_ms']:.2f} ms; errors:")
    for name in ("triton", "triton, measured race, measured spread", IN_ORDER):
        e = rep["rules"][name]["error"]
        print(f"    {name:52s} mean batch {e['mean_batch']:+6.1%}  queue p90 "
              f"{e['queue_p90_ms']:+6.1%}  p99 {e['queue_p99_ms']:+6.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=1400.0, help="requests/s")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=2, help="the run's arrivals")
    a = ap.parse_args()
    if not 1 <= a.rate <= 5000 or not 1 <= a.duration <= 60 or not 1 <= a.runs <= 20:
        sys.exit("--rate 1 to 5000, --duration 1 to 60 s, --runs 1 to 20")
    with tempfile.TemporaryDirectory(prefix="servelab-tail-") as tmp:
        model = write_mlp(Path(tmp) / "mlp.onnx", **VALIDATION_MLP)
        print("                 p50    p90    p99 (ms)")
        for run in range(a.runs):
            print(f"run {run + 1} at {a.rate:g}/s:")
            one_run(model, a.rate, a.duration, a.seed, Path(tmp))


if __name__ == "__main__":
    main()
