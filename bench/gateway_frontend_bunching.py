"""How the gateway's front end hands requests to its batcher, beside the simulator's
event loop given the same send times: issue 28's open lead (at 50% of saturation the
simulated batches come out 10-14% small given the run's own batch times, while replaying
the gateway's own batcher-side arrivals gives them within 1-2%).

Each run starts `servelab serve` with `--trace-file` (the demo model `validate --serve
demo` serves), warms it 3 s at 300/s, then sends one open-loop Poisson run at the rate.
The client's send times and the trace's queue-entry times share this machine's monotonic
clock, so each request's time in the front end (send to queue entry) is read directly.
The same send times then go through `batching.answering.answering_run` (the loop that
parses and answers, with the costs given: validate prints its fit as "front end ...") and
the batches each arrival stream gives the engine are compared, with the run's own
per-size batch times (compute and turnaround, as `replay-trace` reads them).

    python bench/gateway_frontend_bunching.py [--rate 1200] [--duration 10] [--runs 1]
        [--cost-ms 0.159 --answer-ms 0.106 --turn-ms 0.062]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from gateway_tail_split import traced_run  # noqa: E402
from servelab.batching.answering import answering_run  # noqa: E402
from servelab.batching.simulate import simulate_policy  # noqa: E402
from servelab.batching.stalls import Stalls  # noqa: E402
from servelab.gateway.demo import VALIDATION_MLP, write_mlp  # noqa: E402
from servelab.measure.replay import measured_batches  # noqa: E402
from servelab.measure.split import measured_split  # noqa: E402
from servelab.measure.stall_fit import fit_stalls  # noqa: E402
from servelab.scenario import BatchingPolicy  # noqa: E402
from servelab.trace_file import TraceRequests  # noqa: E402

POLICY = BatchingPolicy(max_batch_size=32, max_queue_delay_microseconds=2000)  # the demo's


def pct(a: np.ndarray) -> str:
    return " ".join(f"{np.percentile(a, p):6.3f}" for p in (10, 50, 90, 99))


def bunching(at_ns: np.ndarray, window_ns: int = 2_000_000) -> str:
    """Arrivals handed over at (almost) the same instant, and the spread of counts in
    windows as long as the batch delay (variance / mean: 1 for Poisson)."""
    gaps = np.diff(np.sort(at_ns))
    together = float(np.mean(gaps < 20_000))
    counts = np.bincount(((at_ns - at_ns.min()) // window_ns).astype(np.int64))
    return (f"gap < 20 us {together:5.1%}, gap p50 {np.median(gaps) / 1e3:6.1f} us, "
            f"count per 2 ms var/mean {counts.var() / counts.mean():5.2f}")


def one_run(model: Path, a: argparse.Namespace, folder: Path) -> None:
    res, tr = traced_run(model, a.rate, a.duration, a.seed, folder)
    ok = res.status == 200
    n = int(ok.sum())
    keep = tr.queue_ns >= res.t0_ns  # the run's requests (the warm-up's came before t0)
    run = TraceRequests(tr.model, tr.queue_ns[keep], tr.start_ns[keep], tr.end_ns[keep], 0)
    sent = np.sort(np.maximum(res.sent_ns, res.intended_ns)[ok])  # ns from t0
    queued = run.queue_ns - res.t0_ns
    print(f"  {n} answered, {queued.size} in the trace; (ms, p10 p50 p90 p99) sent late "
          f"{pct(res.behind_ms)}; latency from the send (ms) "
          f"{pct((res.done_ns - np.maximum(res.sent_ns, res.intended_ns))[ok] / 1e6)}")
    m = min(sent.size, queued.size)
    split = measured_split(res, run)
    if split is not None:
        print("  where the time went (ms)   p50    p90    p99")
        for name, p in split.items():
            print(f"    {name:20s}{p['p50']:7.3f}{p['p90']:7.3f}{p['p99']:7.3f}")
    mb = measured_batches(run, POLICY.max_batch_size, POLICY.max_queue_delay_microseconds
                          * 1000)
    table = mb.table_ns
    one = np.ones(1)
    real = simulate_policy(queued, table, one, POLICY, 1)
    measured_mean = run.queue_ns.size / np.unique(run.start_ns).size
    span_s = float(run.end_ns.max() - run.queue_ns.min()) / 1e9
    fit = fit_stalls(run.start_ns, run.end_ns, span_s)
    assert fit is not None
    clean = table.copy()
    for k, (count, ns) in fit.clean.items():
        clean[k] = ns / count + mb.turnaround_ns[k]
    print(f"  stalls in the batches: {fit.per_s:.1f}/s, p50 {np.median(fit.lengths_ms):.2f} ms"
          f", {fit.share:.1%} of the batches' time")
    print(f"  mean batch: measured {measured_mean:5.2f}; engine on the gateway's queue "
          f"entries {np.mean(real.batch_size):5.2f}")
    print("  send to queue entry (ms)   p10    p50    p90    p99     mean batch  "
          "send to answer p50, p99")
    print(f"    gateway (in order)  {pct((queued[:m] - sent[:m]) / 1e6)}        "
          f"{measured_mean:5.2f}   client {np.percentile(res.latency_ms, 50):6.2f} "
          f"{np.percentile(res.latency_ms, 99):6.2f}")
    costs = (round(a.cost_ms * 1e6), round(a.turn_ms * 1e6), round(a.answer_ms * 1e6))
    for name, stalls in (("no stalls", False), ("server stalls", True)):
        whole = Stalls(fit.per_s, fit.lengths_ms, np.random.default_rng(a.seed))
        at_server = whole.to_server(sent) if stalls else sent
        (_, _, b_size, _, _, _), at_sim, answered = answering_run(
            at_server, *costs, clean if stalls else table, one, POLICY, 1)
        if stalls:
            at_sim, answered = whole.to_real(at_sim), whole.to_real(answered)
        lat = (answered - sent) / 1e6
        print(f"    {name:18s}  {pct((at_sim - sent) / 1e6)}        {np.mean(b_size):5.2f}"
              f"   server {np.percentile(lat, 50):6.2f} {np.percentile(lat, 99):6.2f}")
        if name == "no stalls":
            print(f"  gateway's queue entries:  {bunching(queued)}")
            print(f"  simulated hand-overs:     {bunching(at_sim)}")
            print(f"  client's send times:      {bunching(sent)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=1200.0, help="requests/s")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=2, help="the run's arrivals")
    ap.add_argument("--cost-ms", type=float, default=0.159, help="the loop's parse a request")
    ap.add_argument("--answer-ms", type=float, default=0.106, help="its answer a request")
    ap.add_argument("--turn-ms", type=float, default=0.062, help="its cost a turn")
    a = ap.parse_args()
    if not 1 <= a.rate <= 5000 or not 1 <= a.duration <= 60 or not 1 <= a.runs <= 20:
        sys.exit("--rate 1 to 5000, --duration 1 to 60 s, --runs 1 to 20")
    if not all(0 <= x <= 10 for x in (a.cost_ms, a.answer_ms, a.turn_ms)):
        sys.exit("--cost-ms, --answer-ms, --turn-ms: 0 to 10 ms")
    with tempfile.TemporaryDirectory(prefix="servelab-bunch-") as tmp:
        model = write_mlp(Path(tmp) / "mlp.onnx", **VALIDATION_MLP)
        for run in range(a.runs):
            print(f"run {run + 1} at {a.rate:g}/s:")
            one_run(model, a, Path(tmp))


if __name__ == "__main__":
    main()
