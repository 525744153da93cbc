"""Does the gateway's event loop pause when a batch starts or ends? Issue 28's open lead:
the instance's and the timer's threads take the interpreter from the loop to close, start
and answer a batch, and the simulator's loop runs beside them undisturbed.

Each run starts `servelab serve` with `--trace-file` (the demo model `validate --serve
demo` serves), warms it 3 s at 300/s, then sends one open-loop Poisson run at the rate
(`gateway_tail_split.traced_run`). It prints how often requests entered the batcher's
queue (per ms) by the time since the latest batch end and since the latest batch start,
beside the same for the client's send times shifted by the median send-to-queue delay
(where the loop does not pause, both read flat at the rate), and for the simulator's
event loop given the run's send times, the costs validate fits (`--cost-ms`,
`--answer-ms`, `--turn-ms`: its "front end" line) and the run's own batch times.

    python bench/gateway_boundary_pauses.py [--rates 700,1100] [--duration 8]
        [--cost-ms 0.357 --answer-ms 0.238 --turn-ms 0.029]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from gateway_tail_split import traced_run  # noqa: E402
from servelab.batching.answering import answering_run  # noqa: E402
from servelab.gateway.demo import VALIDATION_MLP, write_mlp  # noqa: E402
from servelab.measure.replay import measured_batches  # noqa: E402
from servelab.scenario import BatchingPolicy  # noqa: E402
from servelab.trace_file import TraceRequests  # noqa: E402

POLICY = BatchingPolicy(max_batch_size=32, max_queue_delay_microseconds=2000)  # the demo's
BINS_MS = np.array([0.0, 0.1, 0.2, 0.4, 0.7, 1.0, 1.5, 2.0, 3.0])


def per_ms_since(events_ns: np.ndarray, marks_ns: np.ndarray) -> np.ndarray:
    """Events per ms in each BINS_MS bin of the time since the latest mark before them:
    each bin's count over the time the gaps between marks spent in it."""
    marks = np.unique(marks_ns)
    events = np.sort(events_ns)
    idx = np.searchsorted(marks, events, side="right") - 1
    after = idx >= 0
    since_ms = (events[after] - marks[idx[after]]) / 1e6
    gaps_ms = np.diff(marks) / 1e6
    exposure = np.array([np.clip(gaps_ms - lo, 0.0, hi - lo).sum()
                         for lo, hi in itertools.pairwise(BINS_MS)])
    counts, _ = np.histogram(since_ms, BINS_MS)
    return counts / np.maximum(exposure, 1e-9)


def row(name: str, values: np.ndarray) -> str:
    return f"    {name:34s}" + " ".join(f"{v:5.2f}" for v in values)


def one_rate(model: Path, rate: float, a: argparse.Namespace, folder: Path) -> None:
    res, tr = traced_run(model, rate, a.duration, a.seed, folder)
    keep = tr.queue_ns >= res.t0_ns  # the run's requests (the warm-up's came before t0)
    queued, start, end = tr.queue_ns[keep], tr.start_ns[keep], tr.end_ns[keep]
    ok = res.status == 200
    sent = np.sort(np.maximum(res.sent_ns, res.intended_ns)[ok]) + res.t0_ns
    m = min(sent.size, queued.size)
    lag = int(np.median(np.sort(queued)[:m] - sent[:m]))
    run = TraceRequests(tr.model, queued, start, end, 0)
    mb = measured_batches(run, POLICY.max_batch_size, POLICY.max_queue_delay_microseconds
                          * 1000)
    costs = (round(a.cost_ms * 1e6), round(a.turn_ms * 1e6), round(a.answer_ms * 1e6))
    (_, _, b_size, b_start, b_end, _), at_sim, _ = answering_run(
        sent - res.t0_ns, *costs, mb.table_ns + mb.turnaround_ns, np.ones(1), POLICY, 1)
    print(f"{rate:.0f}/s: {queued.size} requests, send to queue entry p50 {lag / 1e6:.3f} ms,"
          f" {queued.size / (np.ptp(queued) / 1e6):.3f} a ms; mean batch "
          f"{queued.size / np.unique(start).size:.2f}, the simulated loop's "
          f"{np.mean(b_size):.2f}")
    print("    per ms, by ms since the mark      " + " ".join(f"{b:5.1f}" for b in BINS_MS[:-1]))
    for mark, real, sim in (("batch end", end, b_end), ("batch start", start, b_start)):
        print(row(f"queue entries after a {mark}", per_ms_since(queued, real)))
        print(row(f"sends + {lag / 1e6:.2f} ms after a {mark}", per_ms_since(sent + lag, real)))
        print(row(f"simulated loop after a {mark}", per_ms_since(at_sim, sim)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="700,1100", help="requests/s, comma-separated")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds a rate")
    ap.add_argument("--seed", type=int, default=2, help="the runs' arrivals")
    ap.add_argument("--cost-ms", type=float, default=0.357, help="the loop's parse a request")
    ap.add_argument("--answer-ms", type=float, default=0.238, help="its answer a request")
    ap.add_argument("--turn-ms", type=float, default=0.029, help="its cost a turn")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="servelab-bench-") as tmp:
        model = write_mlp(Path(tmp) / "mlp.onnx", **VALIDATION_MLP)
        for rate in (float(r) for r in a.rates.split(",")):
            one_rate(model, rate, a, Path(tmp))


if __name__ == "__main__":
    main()
