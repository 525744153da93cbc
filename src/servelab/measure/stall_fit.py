"""Read a server's stalls from its trace: how often the whole server paused, for how long.

The simulator's stalls (batching/stalls.py) pause the whole server, front end and
batcher and model together. What a trace shows of them is the batches they fell in:
such a batch took its size's usual time plus the stall. So a batch that took more
than STALL_FACTOR times its size's median, and at least STALL_MIN_MS more, is taken as
its size's median plus one stall of the difference. A stall while the server was idle
shows in no batch; the rate is the stalls found over the whole span read, less the
stalls themselves (the server's own running time), so the simulator's stalls, which
fall anywhere in time, are as many as were seen. Over the batches' time alone the
rate would assume as many more stalls in the idle time as there were in the busy time:
at 20% of saturation, five times as many as seen, where the rate seen per batch-second
grows with the load (docs/load-and-validate.md). The batches' times with the stalls
taken out are the per-size times the prediction then uses, so no stall is counted
twice.

The threshold is a choice, not a fit: below it a batch's spread is its own (what the
size's mean keeps), above it the batch is a stall. STALL_FACTOR 2 and STALL_MIN_MS 1
were set from the gateway's traces of 2026-12-05 (docs/load-and-validate.md, "Stalls").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from servelab.measure.replay import batches_of
from servelab.scenario import MAX_MULTIPLIER

STALL_FACTOR = 1.5  # a batch this many times its size's median time ...
STALL_MIN_MS = 0.5  # ... and at least this much longer (ms) holds a stall
MIN_SIZE_BATCHES = 5  # batches of one size before its median is a base time
MAX_STALL_SAMPLES = 10_000  # the stall lengths kept (evenly through the sorted lengths)


@dataclass(frozen=True, slots=True)
class StallFit:
    per_s: float  # stalls per second of the server's running time over the span read
    lengths_ms: tuple[float, ...]  # each stall found (at most MAX_STALL_SAMPLES, sorted)
    batches: int  # batches read
    stalls: int  # stalls found
    busy_s: float  # the batches' time without their stalls
    stalled_s: float  # the stalls' time in them
    span_s: float  # the span read (the first request's queue entry to the last end)
    # per batch size: (batches, their time in ns without the stalls), as a server's
    # statistics count them (validate.with_sizes takes them so)
    clean: dict[int, tuple[int, int]]

    @property
    def share(self) -> float:
        """The share of the batches' time that was stalls."""
        total = self.busy_s + self.stalled_s
        return self.stalled_s / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        lengths = np.asarray(self.lengths_ms)
        return {"per_s": self.per_s, "stalls": self.stalls, "batches": self.batches,
                "busy_s": self.busy_s, "span_s": self.span_s,
                "share_of_batch_time": self.share,
                "length_ms": None if not lengths.size else {
                    "p50": float(np.percentile(lengths, 50)),
                    "p90": float(np.percentile(lengths, 90)),
                    "max": float(lengths.max()), "mean": float(lengths.mean())}}


def usual_ns(size: np.ndarray, exec_ns: np.ndarray) -> np.ndarray:
    """Each batch's usual time (ns): its size's median where that size ran
    MIN_SIZE_BATCHES times or more, elsewhere interpolated between such sizes (flat past
    the ends). Empty when no size ran that often."""
    sizes, counts = np.unique(size, return_counts=True)
    seen = sizes[counts >= MIN_SIZE_BATCHES]
    if not seen.size:
        return np.zeros(0)
    med = np.array([np.median(exec_ns[size == k]) for k in seen], np.float64)
    out: np.ndarray = np.interp(size.astype(np.float64), seen.astype(np.float64), med)
    return out


def _stalled_batches(start_ns: np.ndarray, end_ns: np.ndarray
                     ) -> tuple[np.ndarray, ...] | None:
    """A trace's batches, in the order they started: (start, end, size, time ns, its
    size's usual time, whether it held a stall: STALL_FACTOR times the usual time and
    STALL_MIN_MS more). None when no size ran often enough to have a usual time."""
    b_start, b_end, size = batches_of(np.asarray(start_ns, np.int64),
                                      np.asarray(end_ns, np.int64))
    exec_ns = (b_end - b_start).astype(np.float64)
    base = usual_ns(size, exec_ns)
    if not base.size:
        return None
    stalled = (exec_ns > STALL_FACTOR * base) & (exec_ns - base >= STALL_MIN_MS * 1e6)
    return b_start, b_end, size, exec_ns, base, stalled


def fit_stalls(start_ns: np.ndarray, end_ns: np.ndarray, span_s: float | None = None
               ) -> StallFit | None:
    """The stalls in a trace's requests (each request's COMPUTE_START and COMPUTE_END;
    the requests of a batch share both) over `span_s` seconds (None: from the first
    batch's start to the last one's end). None when no batch size ran often enough to
    have a usual time."""
    read = _stalled_batches(start_ns, end_ns)
    if read is None:
        return None
    b_start, b_end, size, exec_ns, base, stalled = read
    excess = exec_ns - base
    clean_ns = np.where(stalled, base, exec_ns)
    busy_s = float(clean_ns.sum()) / 1e9
    lengths = np.sort(excess[stalled]) / 1e6
    stalled_s = float(lengths.sum()) / 1e3
    if span_s is None:
        span_s = float(b_end.max() - b_start.min()) / 1e9
    running_s = max(span_s - stalled_s, busy_s)
    if lengths.size > MAX_STALL_SAMPLES:
        lengths = lengths[np.linspace(0, lengths.size - 1, MAX_STALL_SAMPLES).astype(int)]
    count = np.bincount(size)
    total = np.bincount(size, weights=clean_ns)
    clean = {int(k): (int(count[k]), round(float(total[k]))) for k in np.flatnonzero(count)}
    return StallFit(int(stalled.sum()) / running_s if running_s > 0 else 0.0,
                    tuple(float(x) for x in lengths), int(size.size), int(stalled.sum()),
                    busy_s, stalled_s, span_s, clean)


# validate draws the warm-up's batch times in runs of this many consecutive batches
# (`speed_series`): a server's speed drifts over tens of batches. On the gateway at 800
# and 1,150/s (2026-12-06, the AMD VM) each batch's time over its size's mean had a lag-1
# autocorrelation of 0.25-0.42, fading over 20-50 batches; its 200 ms means spread 2.4-3.2
# times as far as independent batches' would. Runs of 20 and of 100 batches predicted the
# second half of a run from its first alike (queue + compute p99 −8% and −9% at 800/s,
# −23% and −21% at 1,150/s, against −16% and −35% with each size's mean alone and −13%
# and −30% with the batches drawn one by one).
SERIES_BLOCK = 50
MAX_SERIES = 100_000  # batches kept (every k-th beyond)


def speed_series(start_ns: np.ndarray, end_ns: np.ndarray, clean: bool) -> np.ndarray:
    """Each batch's time over its size's mean, in the order the batches ran (a trace's
    requests' COMPUTE_START and COMPUTE_END): the simulator's empirical multipliers,
    drawn in runs of SERIES_BLOCK. `clean`: a stalled batch counts at its size's usual
    time, as where the stalls are simulated apart (`fit_stalls`). Empty when no size
    ran MIN_SIZE_BATCHES times."""
    read = _stalled_batches(start_ns, end_ns)
    if read is None:
        return np.zeros(0)
    _, _, size, exec_ns, base, stalled = read
    if clean:
        exec_ns = np.where(stalled, base, exec_ns)
    mean = (np.bincount(size, weights=exec_ns) / np.maximum(np.bincount(size), 1))[size]
    out: np.ndarray = np.clip(np.divide(exec_ns, mean, out=np.ones_like(exec_ns),
                                        where=mean > 0), 0.0, MAX_MULTIPLIER)
    if out.size > MAX_SERIES:  # every k-th: the same drift, within the cap
        out = out[:: -(-out.size // MAX_SERIES)]
    return out
