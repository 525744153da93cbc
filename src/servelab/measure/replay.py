"""Replay a real Triton's trace through the simulator's batcher.

`servelab validate` holds the whole prediction against a server, so its errors mix
the service-time profile, the time outside the server and the batching rule. A
Triton trace (``--trace-config level=TIMESTAMPS`` with ``triton,file=PATH``) takes
the first two out: it records, per request, when it entered the scheduler's queue
(``QUEUE_START``) and when its batch ran (``COMPUTE_START``, ``COMPUTE_END``). The
replay gives the simulator those very queue-entry times and, per batch size, the time
a batch held its instance (its mean compute, and the instance's turnaround before the
next batch), and compares what Triton's batching rule makes of them (as the source
orders a completion, and with the completion race as the trace shows it) with what
Triton did:

- mean batch, and the queue (``COMPUTE_START - QUEUE_START``, Triton's own "queue"
  statistic) at the mean, p50, p90 and p99;
- the share of batches that started while an older request they had room for was
  still waiting (it went to a later batch): the signature of Triton's rule, which
  closes a payload at its delay while the instance is busy (a rule where a batch takes
  every waiting request it has room for would give 0).

Two things a trace shows that the rule alone does not (docs/load-and-validate.md, "The
batch race"), both read from the trace, neither fitted to the figures compared:

- **the turnaround**: after ``COMPUTE_END`` the instance still answers and releases the
  batch's requests, then takes and stages the next payload, before ``COMPUTE_START``.
  On the test's Triton its median is 60-80 us after a batch of 1-2 and 230-420 us
  after one of 17-32 (2026-12-03). Without it the replay's instance ran faster than
  Triton's and its batches came out 3-6% small at 500-1,000/s.
- **the completion race** (``batcher_first``): the completion's callback wakes the
  batcher thread, and the freed instance goes on to take the waiting payload. Which of
  the two threads gets there first is the operating system's choice; on a busy machine
  the woken thread often runs first and grows the payload with what has queued. The
  share is read from the trace (`race_share`): 6-9% at 200/s, 19-27% at 500-1,000/s
  on the quiet 2-core machine, 31-48% with a test run beside it.

Compute times are the mean of the batches of each size (what differs is then the
rule, not the draws), and in one more row the measured per-batch spread resampled
(each batch's time over its size's mean), which is what reaches the queue's tail.
Requests of one row each, as the engine models them (the file is read by
servelab.trace_file). `trace_scenario` turns all of it into a scenario the other
commands take.
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
    """What the trace's batches took: per size, and per batch against its size's mean.

    ``table_ns`` is what a batch of each size holds its instance for: its compute
    (``COMPUTE_START`` to ``COMPUTE_END``) plus the instance's turnaround after it (from
    its ``COMPUTE_END`` to the next batch's ``COMPUTE_START`` when that batch's payload
    was already waiting: the backend's answers and releases, the dequeue and the next
    batch's staging), which is what the engine's instance is busy for."""

    compute_ns: np.ndarray  # mean compute ns per batch size 0..max_batch_size (0 unused)
    turnaround_ns: np.ndarray  # mean turnaround ns after a batch of each size
    sizes_seen: np.ndarray  # the sizes some batch had (the others are interpolated)
    spread: np.ndarray  # each batch's time (compute + its size's turnaround) over the mean

    @property
    def table_ns(self) -> np.ndarray:
        table: np.ndarray = self.compute_ns + self.turnaround_ns
        return table

    def exec_ms_by_size(self) -> dict[int, float]:
        return {int(k): float(self.compute_ns[k] / 1e6) for k in self.sizes_seen}

    def turnaround_ms_by_size(self) -> dict[int, float]:
        return {int(k): float(self.turnaround_ns[k] / 1e6) for k in self.sizes_seen}


def _per_size(size: np.ndarray, value: np.ndarray, max_batch_size: int) -> np.ndarray:
    """Mean of `value` per batch size (index 0 unused), sizes never seen interpolated and
    held flat beyond the measured ones; zeros where nothing was measured."""
    table = np.zeros(max_batch_size + 1)
    count = np.bincount(size, minlength=max_batch_size + 1)
    seen = np.flatnonzero(count)
    if seen.size:
        mean = np.bincount(size, weights=value, minlength=max_batch_size + 1)[seen] / count[seen]
        table[1:] = np.interp(np.arange(1, max_batch_size + 1), seen, mean)
    return table


@dataclass(frozen=True, slots=True, eq=False)
class TraceBatches:
    """The trace's batches in start order, with the first request of each."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    size: np.ndarray
    first_ns: np.ndarray  # queue entry of each batch's oldest request
    of_request: np.ndarray  # each request's batch (index into the arrays above)

    def waiting_at_end(self, delay_ns: int) -> np.ndarray:
        """Per batch but the last: was the next batch's payload waiting when it ended (its
        oldest request's delay expired by then, so the batcher had closed it)?"""
        return self.first_ns[1:] + delay_ns <= self.end_ns[:-1]


def trace_batches(tr: TraceRequests) -> TraceBatches:
    b_start, b_end, size = batches_of(tr.start_ns, tr.end_ns)
    of_request = np.searchsorted(b_start, tr.start_ns)
    first = np.full(b_start.size, np.iinfo(np.int64).max)
    np.minimum.at(first, of_request, tr.queue_ns)
    return TraceBatches(b_start, b_end, size, first, of_request)


def measured_batches(tr: TraceRequests, max_batch_size: int, delay_ns: int,
                     instances: int = 1, tb: TraceBatches | None = None) -> MeasuredBatches:
    """The mean measured compute of batches of each size, the instance's turnaround after
    each size, and each batch's spread around its size's mean. The turnaround is read
    between consecutive batches, so only with one instance (with more, a trace does not
    say which batch followed which on an instance): 0 otherwise. `tb`: the trace's
    batches, when already read."""
    tb = tb if tb is not None else trace_batches(tr)
    if tb.size.max() > max_batch_size:
        raise InputError(f"--max-batch-size = {max_batch_size}: the trace has a batch of "
                         f"{int(tb.size.max())} requests; fix: the model's max_batch_size")
    dur = (tb.end_ns - tb.start_ns).astype(np.float64)
    compute = _per_size(tb.size, dur, max_batch_size)
    turn = np.zeros(max_batch_size + 1)
    if instances == 1 and tb.size.size > 1:
        waiting = tb.waiting_at_end(delay_ns)
        # (not below 0: batches that overlap came from more instances than were given)
        gap = np.maximum(tb.start_ns[1:] - tb.end_ns[:-1], 0).astype(np.float64)
        turn = _per_size(tb.size[:-1][waiting], gap[waiting], max_batch_size)
    table = compute + turn
    return MeasuredBatches(compute, turn, np.flatnonzero(np.bincount(tb.size)),
                           (dur + turn[tb.size]) / table[tb.size])


def race_share(tr: TraceRequests, max_batch_size: int, delay_ns: int, instances: int = 1,
               tb: TraceBatches | None = None) -> tuple[float, int]:
    """(share, completions judged): how often the batcher thread grew the waiting payload
    at a completion, before the freed instance took it, read from the trace's own events.

    A completion is judged when the next batch's payload was waiting (closed, its oldest
    request's delay expired) and requests arrived after it closed and before the
    completion. Under the source's order those go to a later payload; when the thread
    looks first they join it. It counts as won when the latest of them joined. It is
    judged only where the payload had room for all of them (won or lost alike, so the
    room does not tilt the count). The payload closes at its oldest request's delay, or
    when the previous batch started if that is later (a payload of requests already past
    their delay closes at once); the earliest request after the close is left out, since
    the rule lets one arrival join a payload closed that way. Only with one instance
    (with more, the trace does not say which batch an instance ran
    next): (0, 0) otherwise. `tb`: the trace's batches, when already read."""
    tb = tb if tb is not None else trace_batches(tr)
    if instances != 1 or tb.size.size < 2:
        return 0.0, 0
    order = np.argsort(tr.queue_ns, kind="stable")
    q, batch = tr.queue_ns[order], tb.of_request[order]
    won = judged = 0
    for n in np.flatnonzero(tb.waiting_at_end(delay_ns)) + 1:
        close = max(int(tb.first_ns[n]) + delay_ns, int(tb.start_ns[n - 1]))
        lo = np.searchsorted(q, close, side="right") + 1  # the earliest after it left out
        hi = np.searchsorted(q, tb.end_ns[n - 1], side="left")
        if hi <= lo:
            continue
        joined = int((batch[lo:hi] == n).sum())
        if tb.size[n] - joined + (hi - lo) > max_batch_size:
            continue  # no room for all of them, won or lost: not judged
        judged += 1
        won += int(batch[hi - 1] == n)
    return (won / judged if judged else 0.0), judged


RACE_SEEDS = 3  # draws of the races averaged for the rows that use the measured share
# The diagnosis row: the measured spread in the trace's own order (see `_rule_on`). Not a
# prediction: it replays the very moments the server ran slow.
IN_ORDER = "triton, measured race, measured spread in its order"


def _rule_on(tr: TraceRequests, policy: BatchingPolicy, table: np.ndarray, instances: int,
             seeds: int = 1, spread: np.ndarray | None = None,
             in_order: bool = False) -> dict[str, float]:
    """The engine on the trace's arrivals; figures averaged over `seeds` draws (of the
    races, and of the per-batch spread resampled when it is given). `in_order`: the
    spread is not resampled but taken in the trace's order, the k-th batch run at the
    k-th measured batch's multiplier (1 past the trace's last), so the server's slow
    stretches stay where they were, beside the arrivals they held up. The batches keep
    step with the trace's while the rule forms the same ones; a drawn race can put
    them out of step."""
    runs = []
    n = tr.queue_ns.size
    for seed in range(seeds):
        if spread is not None and in_order:
            mult = np.ones(n)
            mult[:min(n, spread.size)] = spread[:n]
        else:
            mult = (np.ones(1) if spread is None else draw_multipliers(
                Variability.EMPIRICAL, 0.0, n, np.random.default_rng(seed), tuple(spread)))
        rec = simulate_policy(tr.queue_ns - tr.queue_ns[0], table, mult, policy,
                              instances, seed=seed)
        served = rec.start_ns >= 0
        runs.append(summarize(rec.arrival_ns[served], rec.start_ns[served],
                              rec.end_ns[served], policy.max_batch_size))
    return {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}


def replay(tr: TraceRequests, policy: BatchingPolicy, instances: int) -> dict[str, Any]:
    """The measured batching beside the Triton rule's, on the trace's arrivals, with
    each batch holding its instance for its size's measured compute and turnaround: as
    the source orders a completion (the instance takes the next payload first), and with
    the share of races the batcher thread won as read from the trace (`race_share`)."""
    mbs = policy.max_batch_size
    delay_ns = policy.max_queue_delay_microseconds * 1000
    tb = trace_batches(tr)
    mb = measured_batches(tr, mbs, delay_ns, instances, tb)
    table, spread = mb.table_ns, mb.spread
    measured = summarize(tr.queue_ns, tr.start_ns, tr.end_ns, mbs)
    share, judged = race_share(tr, mbs, delay_ns, instances, tb)
    share = round(share, 3)
    raced = replace(policy, batcher_first=share)
    rules: dict[str, Any] = {}
    for name, pol, seeds, sp, in_order in (
            ("triton", replace(policy, batcher_first=0.0), 1, None, False),
            ("triton, measured race", raced, RACE_SEEDS, None, False),
            ("triton, measured race, measured spread", raced, RACE_SEEDS, spread, False),
            (IN_ORDER, raced, RACE_SEEDS, spread, True)):
        got: dict[str, Any] = dict(_rule_on(tr, pol, table, instances, seeds, sp, in_order))
        got["error"] = {k: (got[k] - m) / m if m else None
                        for k, m in measured.items() if k != "batches"}
        rules[name] = got
    t0 = tr.queue_ns[0]
    notes = gap_note(*batch_gaps(tr.queue_ns, tr.start_ns, tr.end_ns), "in the trace")
    if instances > 1:
        notes.append(f"{instances} instances: a trace does not say which batch an instance "
                     "ran next, so the turnaround between batches and the completion race "
                     "are not read (0)")
    return {"model": tr.model, "requests": int(tr.queue_ns.size), "skipped": tr.skipped,
            "span_s": float((tr.queue_ns[-1] - t0) / 1e9),
            "offered_per_s": float(tr.queue_ns.size / max((tr.queue_ns[-1] - t0) / 1e9, 1e-9)),
            "exec_ms_by_size": mb.exec_ms_by_size(),
            "turnaround_ms_by_size": mb.turnaround_ms_by_size(),
            "batcher_first": share, "races_judged": judged,
            "spread": {"batches": int(spread.size), "cv": float(spread.std() / spread.mean()),
                       "max": float(spread.max())},
            "measured": measured, "rules": rules, "notes": notes}


def trace_scenario(tr: TraceRequests, report: dict[str, Any], policy: BatchingPolicy,
                   instances: int) -> dict[str, Any]:
    """A scenario fitted to the trace: the policy with the measured race, the measured
    time a batch of each size holds its instance (compute and turnaround) as the
    profile, the measured per-batch spread as empirical multipliers, and the trace's
    rate as Poisson arrivals. What happens outside Triton's queue and compute (client,
    network, HTTP) is not in a trace: [latency] is zero."""
    mb = measured_batches(tr, policy.max_batch_size,
                          policy.max_queue_delay_microseconds * 1000, instances)
    spread = mb.spread
    if spread.size > MAX_SAMPLES:  # keep every k-th: the same shape, within the cap
        spread = spread[:: -(-spread.size // MAX_SAMPLES)]
    points = [[int(k), round(float(mb.table_ns[k]) / 1e6, 6)] for k in mb.sizes_seen]
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
