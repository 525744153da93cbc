"""Replay a real Triton's trace through the simulator's batcher.

`servelab validate` holds the whole prediction against a server, so its errors mix
the service-time profile, the time outside the server and the batching rule. A
Triton trace (``--trace-config level=TIMESTAMPS`` with ``triton,file=PATH``) takes
the first two out: it records, per request, when it entered the scheduler's queue
(``QUEUE_START``) and when its batch ran (``COMPUTE_START``, ``COMPUTE_END``). The
replay gives the simulator those very queue-entry times and, per batch size, the
mean execution time Triton measured, and compares what Triton's batching rule
makes of them (as the source orders a completion, and with the completion race
fitted) with what Triton did:

- mean batch, and the queue (``COMPUTE_START - QUEUE_START``, Triton's own "queue"
  statistic) at the mean, p50, p90 and p99;
- the share of batches that started while an older request they had room for was
  still waiting (it went to a later batch): the signature of Triton's rule, which
  closes a payload at its delay while the instance is busy (a rule where a batch takes
  every waiting request it has room for would give 0).

Execution times are the mean of the batches of each size (what differs is then the
rule, not the draws), and in one more row the measured per-batch spread resampled
(each batch's time over its size's mean), which is what reaches the queue's tail.
Requests of one row each, as the engine models them (the file is read by
servelab.trace_file). `trace_scenario` turns all of
it into a scenario the other commands take.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from servelab.batching.service import draw_multipliers
from servelab.batching.simulate import simulate_policy
from servelab.errors import InputError
from servelab.measure.gaps import batch_gaps, gap_note
from servelab.scenario import MAX_SAMPLES, BatchingPolicy, Variability
from servelab.trace_file import TraceRequests


def batches_of(start_ns: np.ndarray, end_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                    np.ndarray]:
    """(start, end, size) of each batch: the requests that ran together share both."""
    pairs = np.stack([start_ns, end_ns], axis=1)
    uniq, counts = np.unique(pairs, axis=0, return_counts=True)
    return uniq[:, 0], uniq[:, 1], counts


def left_behind_share(arrival_ns: np.ndarray, start_ns: np.ndarray, max_batch_size: int
                      ) -> float:
    """Share of batches that started, with room, while an older request waited for a
    later batch."""
    b_start, _, size = batches_of(start_ns, np.zeros_like(start_ns))
    if not b_start.size:
        return 0.0
    by_start = np.argsort(start_ns, kind="stable")
    st, arr = start_ns[by_start], arrival_ns[by_start]
    # earliest arrival among requests that started strictly after each instant
    suffix_min = np.minimum.accumulate(arr[::-1])[::-1]
    after = np.searchsorted(st, b_start, side="right")
    earliest_later = np.where(after < st.size, suffix_min[np.minimum(after, st.size - 1)],
                              np.iinfo(np.int64).max)
    left = (earliest_later < b_start) & (size < max_batch_size)
    return float(left.mean())


def summarize(arrival_ns: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray,
              max_batch_size: int) -> dict[str, float]:
    queue = (start_ns - arrival_ns) / 1e6
    _, _, size = batches_of(start_ns, end_ns)
    p50, p90, p99 = np.percentile(queue, [50, 90, 99])
    return {"batches": int(size.size), "mean_batch": float(size.mean()),
            "queue_mean_ms": float(queue.mean()), "queue_p50_ms": float(p50),
            "queue_p90_ms": float(p90), "queue_p99_ms": float(p99),
            "left_behind_share": left_behind_share(arrival_ns, start_ns, max_batch_size)}


@dataclass(frozen=True, slots=True, eq=False)
class MeasuredBatches:
    """What the trace's batches took: per size, and per batch against its size's mean."""

    table_ns: np.ndarray  # mean ns per batch size 0..max_batch_size (index 0 unused)
    sizes_seen: np.ndarray  # the sizes some batch had (the others are interpolated)
    spread: np.ndarray  # each batch's time over its size's mean

    def exec_ms_by_size(self) -> dict[int, float]:
        return {int(k): float(self.table_ns[k] / 1e6) for k in self.sizes_seen}


def measured_batches(tr: TraceRequests, max_batch_size: int) -> MeasuredBatches:
    """The mean measured time of batches of each size (sizes never seen interpolated,
    held flat beyond the measured ones) and each batch's spread around it."""
    b_start, b_end, size = batches_of(tr.start_ns, tr.end_ns)
    if size.max() > max_batch_size:
        raise InputError(f"--max-batch-size = {max_batch_size}: the trace has a batch of "
                         f"{int(size.max())} requests; fix: the model's max_batch_size")
    dur = (b_end - b_start).astype(np.float64)
    count = np.bincount(size)
    seen = np.flatnonzero(count)
    mean = np.bincount(size, weights=dur)[seen] / count[seen]
    table = np.zeros(max_batch_size + 1)
    table[1:] = np.interp(np.arange(1, max_batch_size + 1), seen, mean)
    return MeasuredBatches(table, seen, dur / table[size])


FIT_SEEDS = 3  # races drawn per share while fitting (common to every share tried)


def _rule_on(tr: TraceRequests, policy: BatchingPolicy, table: np.ndarray, instances: int,
             seeds: int = 1, spread: np.ndarray | None = None) -> dict[str, float]:
    """The engine on the trace's arrivals; figures averaged over `seeds` draws (of the
    races, and of the per-batch spread resampled when it is given)."""
    runs = []
    n = tr.queue_ns.size
    for seed in range(seeds):
        mult = (np.ones(1) if spread is None else draw_multipliers(
            Variability.EMPIRICAL, 0.0, n, np.random.default_rng(seed), tuple(spread)))
        rec = simulate_policy(tr.queue_ns - tr.queue_ns[0], table, mult, policy,
                              instances, seed=seed)
        served = rec.start_ns >= 0
        runs.append(summarize(rec.arrival_ns[served], rec.start_ns[served],
                              rec.end_ns[served], policy.max_batch_size))
    return {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}


def fit_batcher_first(tr: TraceRequests, policy: BatchingPolicy, table: np.ndarray,
                      instances: int, queue_ms: float) -> float:
    """The share of completion races the batcher must win for the Triton rule's mean
    queue to equal the measured one (more races won: less queue), by bisection."""
    def queue_at(share: float) -> float:
        return _rule_on(tr, replace(policy, batcher_first=share),
                        table, instances, FIT_SEEDS)["queue_mean_ms"]

    if queue_at(0.0) <= queue_ms:
        return 0.0
    if queue_at(1.0) >= queue_ms:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(12):  # to 1/4096
        mid = (lo + hi) / 2
        if queue_at(mid) > queue_ms:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 3)


def replay(tr: TraceRequests, policy: BatchingPolicy, instances: int) -> dict[str, Any]:
    """The measured batching beside the Triton rule's, on the trace's arrivals: as the
    source orders a completion (the instance takes the next payload first), and with the
    share of races the batcher wins fitted to the measured mean queue."""
    mbs = policy.max_batch_size
    mb = measured_batches(tr, mbs)
    table, spread = mb.table_ns, mb.spread
    measured = summarize(tr.queue_ns, tr.start_ns, tr.end_ns, mbs)
    share = fit_batcher_first(tr, policy, table, instances, measured["queue_mean_ms"])
    fitted = replace(policy, batcher_first=share)
    rules: dict[str, Any] = {}
    for name, pol, seeds, sp in (
            ("triton", replace(policy, batcher_first=0.0), 1, None),
            ("triton, fitted race", fitted, FIT_SEEDS, None),
            ("triton, fitted race, measured spread", fitted, FIT_SEEDS, spread)):
        got: dict[str, Any] = dict(_rule_on(tr, pol, table, instances, seeds, sp))
        got["error"] = {k: (got[k] - m) / m if m else None
                        for k, m in measured.items() if k != "batches"}
        rules[name] = got
    t0 = tr.queue_ns[0]
    return {"model": tr.model, "requests": int(tr.queue_ns.size), "skipped": tr.skipped,
            "span_s": float((tr.queue_ns[-1] - t0) / 1e9),
            "offered_per_s": float(tr.queue_ns.size / max((tr.queue_ns[-1] - t0) / 1e9, 1e-9)),
            "exec_ms_by_size": mb.exec_ms_by_size(),
            "batcher_first": share,
            "spread": {"batches": int(spread.size), "cv": float(spread.std() / spread.mean()),
                       "max": float(spread.max())},
            "measured": measured, "rules": rules,
            "notes": gap_note(*batch_gaps(tr.queue_ns, tr.start_ns, tr.end_ns), "in the trace")}


def trace_scenario(tr: TraceRequests, report: dict[str, Any], policy: BatchingPolicy,
                   instances: int) -> dict[str, Any]:
    """A scenario fitted to the trace: the policy with the fitted race, the measured
    time per batch size as the profile, the measured per-batch spread as empirical
    multipliers, and the trace's rate as Poisson arrivals. What happens outside Triton's
    queue and compute (client, network, HTTP) is not in a trace: [latency] is zero."""
    spread = measured_batches(tr, policy.max_batch_size).spread
    if spread.size > MAX_SAMPLES:  # keep every k-th: the same shape, within the cap
        spread = spread[:: -(-spread.size // MAX_SAMPLES)]
    points = [[int(k), round(v, 6)] for k, v in report["exec_ms_by_size"].items()]
    if points[0][0] != 1:  # the profile needs batch 1: the smallest measured size's time
        points.insert(0, [1, points[0][1]])
    return {
        "name": f"replay-trace-{report['model'] or 'model'}",
        "description": (f"Fitted by servelab replay-trace to a Triton trace of "
                        f"{report['requests']:,} requests ({report['offered_per_s']:.0f}/s): "
                        "time per batch size, per-batch spread and the completion race "
                        "measured; the time outside Triton is not in a trace (set "
                        "[latency])"),
        "workload": {"qps": round(report["offered_per_s"], 3), "arrival": "poisson",
                     "num_requests": int(min(max(tr.queue_ns.size, 10_000), 200_000)),
                     "seed": 0},
        "batching": {"max_batch_size": policy.max_batch_size,
                     "max_queue_delay_microseconds": policy.max_queue_delay_microseconds,
                     "preferred_batch_size": list(policy.preferred_batch_size),
                     "max_queue_size": policy.max_queue_size,
                     "default_timeout_microseconds": policy.default_timeout_microseconds,
                     "instances_per_gpu": instances,
                     "batcher_first": report["batcher_first"]},
        "hardware": {"num_gpus": 1},
        "model": {"kind": "profile", "name": f"{report['model'] or 'model'}, traced",
                  "points": points, "variability": "empirical",
                  "multipliers": [round(float(x), 5) for x in spread]},
        "latency": {"network_ms": 0.0, "feature_fetch_ms": 0.0},
    }
