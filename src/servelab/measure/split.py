"""Where a request's time went at one rate, measured and simulated, phase by phase.

A server started by `validate --serve` writes a trace (each request's queue entry and
its batch's start and end, on this machine's monotonic clock), and the load generator
knows when it meant to send each request, when it did and when the answer came
(`LoadResult`, whose `t0_ns` is on the same clock). Together they split each request's
latency into:

- **sent late**: the intended send to the actual one (the load generator's own delay);
- **send to queue entry**: the server's front end before the batcher (and the network);
- **queue**: in the batcher's queue;
- **compute**: its batch's run;
- **batch end to answer**: the answer written and read back (and the network).

The client's answered requests are matched to the trace's in order (the k-th sent with
the k-th to enter the queue): the gateway's loop takes requests about in the order they
were sent, so the percentiles are sound where single requests may be paired with a
neighbour. The simulator's own split (`simulated_split`) puts all of the measured time
outside the server that its front end does not model after the answer, so "send to
queue entry" and "batch end to answer" are compared best together.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servelab.batching.simulate import Simulation
from servelab.measure.loadgen import LoadResult
from servelab.trace_file import TraceRequests

PHASES = ("sent late", "send to queue entry", "queue", "compute", "batch end to answer")
MIN_MATCHED = 20  # requests both sides must have for a split


def _pcts(ms: np.ndarray) -> dict[str, float]:
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99)}


def measured_split(res: LoadResult, tr: TraceRequests) -> dict[str, dict[str, float]] | None:
    """Each phase's p50, p90 and p99 (ms) over the run's answered requests, from the load
    generator's result and the server's trace of the same requests (those that entered
    the queue after the run's start). None without the run's start on the monotonic
    clock, or with too few requests on either side."""
    if res.t0_ns <= 0:
        return None
    ok = res.status == 200
    keep = tr.queue_ns >= res.t0_ns
    m = min(int(ok.sum()), int(keep.sum()))
    if m < MIN_MATCHED:
        return None
    sent = np.maximum(res.sent_ns, res.intended_ns)[ok]
    order = np.argsort(sent, kind="stable")[:m]
    intended, sent, done = res.intended_ns[ok][order], sent[order], res.done_ns[ok][order]
    queued = tr.queue_ns[keep][:m] - res.t0_ns
    start, end = tr.start_ns[keep][:m] - res.t0_ns, tr.end_ns[keep][:m] - res.t0_ns
    parts = (sent - intended, queued - sent, start - queued, end - start, done - end)
    return {name: _pcts(part / 1e6) for name, part in zip(PHASES, parts, strict=True)}


def simulated_split(sim: Simulation) -> dict[str, dict[str, float]] | None:
    """The same phases in a simulation, over its served requests: nothing is sent late;
    the front end's time before the batcher is "send to queue entry" (0 without a
    front-end station), and its time after the batch (the answer written) plus the time
    outside the server is "batch end to answer"."""
    rec = sim.records
    served = rec.batch >= 0
    if int(served.sum()) < MIN_MATCHED:
        return None
    arrival = rec.arrival_ns[served]
    sent = sim.sent_ns[served] if sim.sent_ns.size else arrival
    start, end = rec.start_ns[served], rec.end_ns[served]
    before = (arrival - sent) / 1e6
    after_loop = (sim.frontend_s[served] * 1e3 - before) if sim.frontend_s.size else 0.0
    # the time outside: per request where drawn, else its constant (the median)
    outside = np.zeros(arrival.size)
    lat = sim.scenario.latency
    for name, drawn in (("network", sim.network_s), ("feature_fetch", sim.fetch_s)):
        outside += drawn[served] * 1e3 if drawn.size else getattr(lat, f"{name}_ms")
    parts = (np.zeros(arrival.size), before, (start - arrival) / 1e6, (end - start) / 1e6,
             after_loop + outside)
    return {name: _pcts(np.asarray(part, np.float64))
            for name, part in zip(PHASES, parts, strict=True)}


def split_note(at: str, measured: dict[str, Any], simulated: dict[str, Any]) -> str:
    """One line: each phase's p50, measured then simulated."""
    return (f"{at} the warm-up's time went (p50, measured / simulated on its send times): "
            + "; ".join(f"{name} {measured[name]['p50']:.2f} / {simulated[name]['p50']:.2f} ms"
                        for name in PHASES))
