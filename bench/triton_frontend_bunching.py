"""How a real Triton's front end hands requests to its batcher, and what that does to
the batches: issue 28's open lead on `validate --url` (given the run's own batch times
the simulated batches come out 3-4% small against the test's Triton, while replaying
Triton's own queue-entry times gives them within a few percent).

Each run starts the integration test's Triton (PyTriton's Triton 2.51, the 2 ms `sleep`
model, one instance, max_batch_size 32, 2,000 us delay) with its file trace at level
TIMESTAMPS, warms it 2 s at 100/s, then sends one open-loop Poisson run at the rate
from this process. Triton's trace timestamps are on the steady clock, which on Linux is
the monotonic clock the load generator's send times are on, so each request's time from
its send to Triton's HTTP_RECV_START, REQUEST_START and QUEUE_START is read directly
(the k-th send beside the k-th queue entry, in order).

The Triton rule (`replay-trace`'s, batcher_first 0, each batch size's measured compute
and turnaround) then runs on four arrival streams, beside Triton's measured mean batch
and queue: Triton's own queue entries; the client's send times (what `validate`
simulates with no front end); the send times each delayed by a measured delay drawn at
random (independent delays: a front end that does not bunch); and the send times each
delayed by its own measured delay (the same as the queue entries, up to order).

    python bench/triton_frontend_bunching.py [--rates 100,250,400] [--duration 8] [--runs 1]

Needs .venv-pytriton (scripts/test.sh builds it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.integration.test_validate_triton import (  # noqa: E402
    SERVER,
    pytriton_env,
    pytriton_python,
)
from tests.services import HostUse, free_port_run  # noqa: E402

from servelab.files import parse_json  # noqa: E402
from servelab.measure.load import metadata, parse_url  # noqa: E402
from servelab.measure.loadgen import LoadResult, poisson_offsets, run_open_loop  # noqa: E402
from servelab.measure.process import server_process  # noqa: E402
from servelab.measure.replay import (  # noqa: E402
    RACE_SEEDS,
    _rule_on,
    measured_batches,
    race_share,
    summarize,
)
from servelab.measure.validate import http_request, random_bodies  # noqa: E402
from servelab.scenario import BatchingPolicy  # noqa: E402
from servelab.trace_file import TraceRequests  # noqa: E402

POLICY = BatchingPolicy(max_batch_size=32, max_queue_delay_microseconds=2000)
STAMPS = ("HTTP_RECV_START", "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END")


def pct(a: np.ndarray) -> str:
    return " ".join(f"{np.percentile(a, p):7.3f}" for p in (10, 50, 90, 99))


def read_stamps(paths: list[Path]) -> dict[str, np.ndarray]:
    """Every traced request's five timestamps (ns), in order of queue entry. Triton puts
    HTTP_RECV_START on the request's parent trace (the HTTP one) and the rest on the
    model's child trace, whose "parent_id" names it."""
    by_id: dict[Any, dict[str, int]] = defaultdict(dict)
    parent: dict[Any, Any] = {}
    for p in paths:
        for ev in parse_json(p.read_text(), str(p)):
            if "parent_id" in ev:
                parent[ev["id"]] = ev["parent_id"]
            for ts in ev.get("timestamps", []):
                by_id[ev["id"]][ts["name"]] = int(ts["ns"])
    rows = []
    for key, st in by_id.items():
        if "QUEUE_START" not in st or "COMPUTE_END" not in st:
            continue
        merged = {**by_id.get(parent.get(key), {}), **st}
        rows.append([merged.get(k, -1) for k in STAMPS])
    a = np.array(sorted(rows, key=lambda r: r[2]), dtype=np.int64).reshape(-1, len(STAMPS))
    return {k: a[:, i] for i, k in enumerate(STAMPS)}


def traced_run(py: str, rate: float, duration: float, seed: int, folder: Path
               ) -> tuple[LoadResult, dict[str, np.ndarray], str]:
    env = pytriton_env(py)
    port = free_port_run(3)
    trace = folder / f"t{seed}_{time.monotonic_ns()}.json"
    url = f"http://127.0.0.1:{port}"
    use = HostUse()
    with server_process([py, str(SERVER), str(port), str(trace)],
                        f"{url}/v2/models/sleep/ready", timeout_s=120, env=env):
        t = parse_url(url, "sleep")
        bodies = [b for b in random_bodies(metadata(t), 256, 0) if isinstance(b, bytes)]
        reqs = [http_request(t.host, t.port, "/v2/models/sleep/infer", b) for b in bodies]
        asyncio.run(run_open_loop(t.host, t.port, reqs, poisson_offsets(100, 200, 1)))
        # whole files of 500 (Triton writes the last, partial one only at a clean stop)
        n = -(-(int(rate * duration) + 200) // 500) * 500 - 200
        res = asyncio.run(run_open_loop(t.host, t.port, reqs, poisson_offsets(rate, n, seed)))
        expected = (n + 200) // 500
        deadline = time.monotonic() + 30
        while (len(list(folder.glob(trace.name + ".*"))) < expected
               and time.monotonic() < deadline):
            time.sleep(0.2)
    steal, others = use.shares()
    files = sorted(folder.glob(trace.name + ".*"), key=lambda p: int(p.suffix[1:]))
    return res, read_stamps(files), f"steal {steal:.1%}, others {others:.1%}"


def engine_on(arrival_ns: np.ndarray, table: np.ndarray, race: float = 0.0
              ) -> dict[str, float]:
    """The Triton rule on these arrivals, as replay-trace runs it (`_rule_on`); with
    `race`, the batcher thread wins that share of the completion races (figures averaged
    over RACE_SEEDS draws)."""
    at = np.sort(arrival_ns)
    none = np.zeros(0, dtype=np.int64)
    return _rule_on(TraceRequests("sleep", at, none, none, 0),
                    replace(POLICY, batcher_first=race), table, 1,
                    RACE_SEEDS if race else 1)


def one_run(py: str, rate: float, a: argparse.Namespace, folder: Path, seed: int) -> None:
    res, st, quiet = traced_run(py, rate, a.duration, seed, folder)
    ok = res.status == 200
    keep = st["QUEUE_START"] >= res.t0_ns  # the run's requests (the warm-up's came before)
    st = {k: v[keep] for k, v in st.items()}
    sent = np.sort(res.t0_ns + np.maximum(res.sent_ns, res.intended_ns)[ok])
    m = min(sent.size, st["QUEUE_START"].size)
    sent, st = sent[:m], {k: v[:m] for k, v in st.items()}
    print(f"{rate:g}/s, seed {seed}: {int(ok.sum())} answered, {m} traced ({quiet})")
    print("  ms from the send (p10 p50 p90 p99):")
    recv = np.sort(st["HTTP_RECV_START"])
    if (st["HTTP_RECV_START"] > 0).all():
        print(f"    HTTP_RECV_START      {pct((recv - sent) / 1e6)}")
    print(f"    REQUEST_START        {pct((np.sort(st['REQUEST_START']) - sent) / 1e6)}")
    delay = st["QUEUE_START"] - sent
    print(f"    QUEUE_START          {pct(delay / 1e6)}")
    print(f"    sent late            {pct(res.behind_ms[ok])}")
    tr = TraceRequests("sleep", st["QUEUE_START"], st["COMPUTE_START"], st["COMPUTE_END"], 0)
    mb = measured_batches(tr, POLICY.max_batch_size, POLICY.max_queue_delay_microseconds
                          * 1000)
    measured = summarize(tr.queue_ns, tr.start_ns, tr.end_ns, POLICY.max_batch_size)
    rng = np.random.default_rng(seed)
    streams = {"Triton's queue entries": st["QUEUE_START"],
               "the send times": sent,
               "sends + a drawn delay": sent + rng.permutation(delay),
               "sends + their own delay": sent + delay}
    print(f"  {'':40s} mean batch    queue p50    p90    p99 (ms)")
    print(f"  {'Triton (measured)':40s} {measured['mean_batch']:9.3f}   "
          f"{measured['queue_p50_ms']:7.3f} {measured['queue_p90_ms']:6.3f} "
          f"{measured['queue_p99_ms']:6.3f}")
    race, _judged = race_share(tr, POLICY.max_batch_size,
                              POLICY.max_queue_delay_microseconds * 1000)
    rows = [(name, at, mb.table_ns, 0.0) for name, at in streams.items()]
    rows += [(name + ", no turnaround", at, mb.compute_ns, 0.0) for name, at in
             list(streams.items())[:2]]
    rows += [(name + f", race {race:.2f}", at, mb.table_ns, race) for name, at in
             list(streams.items())[:2]]
    for name, at, table, bf in rows:
        r = engine_on(at, table, bf)
        e = (r["mean_batch"] - measured["mean_batch"]) / measured["mean_batch"]
        print(f"  {name:40s} {r['mean_batch']:9.3f} ({e:+5.1%}) {r['queue_p50_ms']:7.3f} "
              f"{r['queue_p90_ms']:6.3f} {r['queue_p99_ms']:6.3f}")
    sizes = np.bincount(np.unique(tr.start_ns, return_counts=True)[1])
    common = np.argsort(sizes)[::-1][:4]
    print("  compute / turnaround ms by size (the four most run): " + ", ".join(
        f"{k}: {mb.compute_ns[k] / 1e6:.3f} / {mb.turnaround_ns[k] / 1e6:.3f} ({sizes[k]})"
        for k in sorted(common) if sizes[k]))
    for name, at in (("queue entries", st["QUEUE_START"]), ("send times", sent)):
        gaps = np.diff(np.sort(at))
        counts = np.bincount(((at - at.min()) // 2_000_000).astype(np.int64))
        print(f"  {name:15s} gap < 50 us {np.mean(gaps < 50_000):5.1%}; count per 2 ms "
              f"var/mean {counts.var() / counts.mean():5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="100,250,400", help="requests/s, comma-separated")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds a run")
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args()
    rates = [float(x) for x in a.rates.split(",")]
    if not all(1 <= r <= 2000 for r in rates) or not 1 <= a.duration <= 60 or not (
            1 <= a.runs <= 10):
        sys.exit("--rates 1 to 2000 each, --duration 1 to 60 s, --runs 1 to 10")
    py = pytriton_python()
    if py is None:
        sys.exit("no PyTriton venv (scripts/test.sh builds .venv-pytriton)")
    with tempfile.TemporaryDirectory(prefix="servelab-triton-bunch-") as tmp:
        for run in range(a.runs):
            for rate in rates:
                one_run(py, rate, a, Path(tmp), seed=run + 2)


if __name__ == "__main__":
    main()
