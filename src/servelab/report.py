"""The Report: every figure servelab computes for a scenario, frozen and JSON-able.

Metrics are computed here from a simulation's flat records, never in a front end.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, wait
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np

from servelab.aside import aside
from servelab.batching.analytic import ClosedForm
from servelab.batching.simulate import Records, Simulation
from servelab.order_stats import percentiles_ns, percentiles_of_batches_ns
from servelab.scenario import scenario_to_dict

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True, slots=True)
class Stat:
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float

    @classmethod
    def of(cls, seconds: np.ndarray) -> Stat:
        if seconds.size == 0:
            return cls(*([float("nan")] * 5))
        p = np.percentile(seconds, PERCENTILES) * 1e3
        return cls(float(seconds.mean() * 1e3), *(float(x) for x in p))

    @classmethod
    def of_ns_weighted(cls, ns: np.ndarray, weights: np.ndarray) -> Stat:
        """The same of int64 nanoseconds each counted weights[i] times."""
        if int(weights.sum()) == 0:
            return cls(*([float("nan")] * 5))
        mean, p = percentiles_ns(ns, PERCENTILES, weights)
        return cls(mean / 1e6, *(x / 1e6 for x in p))

    @classmethod
    def of_served_ns(cls, r: Records, part: str, served: int) -> Stat:
        """Of "queue" (batch start - arrival) or "end_to_end" (batch end - arrival) over
        the `served` requests, read from the records in place (Records.served_ns's
        values, without building them)."""
        if served == 0:
            return cls(*([float("nan")] * 5))
        per_batch = r.batch_start_ns if part == "queue" else r.batch_end_ns
        mean, p = percentiles_of_batches_ns(per_batch, r.batch, r.arrival_ns, served,
                                            PERCENTILES)
        return cls(mean / 1e6, *(x / 1e6 for x in p))

    @classmethod
    def constant(cls, ms: float) -> Stat:
        return cls(ms, ms, ms, ms, ms)


@dataclass(frozen=True, slots=True)
class RequestCounts:
    arrivals: int
    served: int
    rejected: int
    timed_out: int


@dataclass(frozen=True, slots=True)
class BatchingStats:
    mean_batch_size: float
    batch_size_histogram: dict[str, int]
    num_batches: int
    p50_batch_size: float
    p99_batch_size: float


@dataclass(frozen=True, slots=True)
class ThroughputStats:
    offered_qps: float
    served_per_s: float
    duration_s: float


@dataclass(frozen=True, slots=True)
class BatchCost:
    batch_size: int
    exec_ms: float
    rows_per_s: float
    feed: float
    mfu: float | None


@dataclass(frozen=True, slots=True)
class GpuStats:
    gpu: str
    num_gpus: int
    num_instances: int
    busy_fraction: float
    batch_efficiency: float
    effective_utilization: float
    mfu: float | None
    saturated_rows_per_s_per_instance: float
    batch_costs: tuple[BatchCost, ...]


@dataclass(frozen=True, slots=True)
class LatencyStats:
    mean_queue_ms: float
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    components: dict[str, Stat]
    # the p99's 95% interval by batch means (see p99_interval_ms); None unless asked for
    # (run_simulate(..., p99_interval=True): it costs about as much as the report)
    p99_interval_ms: tuple[float | None, float | None] | None = None


@dataclass(frozen=True, slots=True)
class SearchStep:
    num_gpus: int
    p99_ms: float
    busy_fraction: float
    dropped: int
    meets: bool


@dataclass(frozen=True, slots=True)
class PlanStats:
    num_gpus: int
    price_per_gpu_hour_usd: float
    cost_per_million_usd: float
    p99_slo_ms: float
    max_busy_fraction: float
    meets_slo: bool
    verdict: str
    closed_form: ClosedForm | None = None
    search: tuple[SearchStep, ...] = ()


@dataclass(frozen=True, slots=True)
class Report:
    scenario: dict[str, Any]
    requests: RequestCounts
    batching: BatchingStats
    throughput: ThroughputStats
    gpu: GpuStats
    latency: LatencyStats
    plan: PlanStats
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _jsonable(asdict(self))
        return out


MIN_ARRIVALS_TO_JUDGE = 100  # fewer: whether the queue grows cannot be told

BATCHES = 10  # batch means: the run cut into this many consecutive blocks
T_975_9 = 2.262  # Student's t, 97.5th percentile, 9 degrees of freedom


def p99_interval_ms(sim: Simulation, p99: float | None) -> tuple[float | None, float | None]:
    """A 95% interval for the end-to-end p99 by batch means: the served requests in
    arrival order cut into 10 consecutive blocks, each block's p99, and the p99 +- t x
    their standard deviation / sqrt(10). Blocks, not single requests, are taken as
    independent, so queueing's correlation between neighbours widens the interval as
    it should. Constant latency parts shift every block alike and are left out.
    (None, None) with fewer than 1,000 served."""
    e2e = variable_latency_s(sim)
    if p99 is None or not math.isfinite(p99) or e2e.size < 100 * BATCHES:
        return None, None
    m = e2e.size // BATCHES
    blocks = np.percentile(e2e[:m * BATCHES].reshape(BATCHES, m), 99, axis=1) * 1e3
    half = T_975_9 * float(blocks.std(ddof=1)) / math.sqrt(BATCHES)
    return p99 - half, p99 + half


def jsonable(x: Any) -> Any:
    """A nested value with every non-finite float as None (JSON has no NaN or inf)."""
    return _jsonable(x)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


def _hist_percentile(hist: np.ndarray, q: float) -> float:
    """The q-th percentile of the values a histogram counts (numpy's 'linear' method)."""
    n = int(hist.sum())
    if n == 0:
        return float("nan")
    cum = np.cumsum(hist)
    pos = (n - 1) * q / 100.0
    lo, hi = int(np.floor(pos)), int(np.ceil(pos))
    v_lo = float(np.searchsorted(cum, lo + 1))
    v_hi = float(np.searchsorted(cum, hi + 1))
    return v_lo + (v_hi - v_lo) * (pos - lo)


def cost_per_million(num_gpus: int, price_per_gpu_hour: float, served_per_s: float) -> float:
    """Dollars per 1M inferences: GPU-hours paid over inferences served in that hour."""
    if served_per_s <= 0:
        return float("inf")
    return num_gpus * price_per_gpu_hour / (served_per_s * 3600.0) * 1e6


def meets(p99_ms: float, busy: float, dropped: int, slo_ms: float, max_busy: float) -> bool:
    """An SLO is met when every request is served, p99 is within it, busy within the ceiling."""
    return dropped == 0 and p99_ms <= slo_ms and busy <= max_busy


def _verdict(ok: bool, p99_ms: float, busy: float, dropped: int, slo: float, ceiling: float) -> str:
    if ok:
        return f"meets the SLO: p99 {p99_ms:.2f} ms <= {slo:g} ms"
    why = []
    if dropped:
        why.append(f"{dropped} requests rejected or timed out")
    if p99_ms > slo:
        why.append(f"p99 {p99_ms:.2f} ms > SLO {slo:g} ms")
    if busy > ceiling:
        why.append(f"busy {busy:.1%} > ceiling {ceiling:.0%}")
    return "misses the SLO: " + "; ".join(why)


def variable_latency_s(sim: Simulation) -> np.ndarray:
    """Each served request's end-to-end seconds without the latency parts that are
    constant (completion - arrival, plus each component that varies): a constant shifts
    every percentile alike, so it is added to the statistics, not to each request."""
    r = sim.records
    served = r.served
    every = bool(served.all())
    e2e: np.ndarray = r.served_ns("end_to_end") / 1e9
    lat = sim.scenario.latency
    for part, values in (("feature_fetch", sim.fetch_s), ("network", sim.network_s)):
        if not lat.is_constant(part):
            e2e += values if every else values[served]
    if sim.frontend_s.size:  # the front-end station's wait and work, before the batcher
        e2e += sim.frontend_s if every else sim.frontend_s[served]
    return e2e


# Served requests from which the queue's and GPU's percentiles run on a second thread
# (below, starting a thread costs more than it saves).
PARALLEL_STATS = 100_000


def build_report(sim: Simulation, *, closed_form: ClosedForm | None = None,
                 search: tuple[SearchStep, ...] = ()) -> Report:
    """All metrics of one simulation, and the plan figures at its GPU count."""
    served = int(sim.records.batch_size.sum())
    if served < PARALLEL_STATS:
        return _build_report(sim, closed_form, search, None)
    # The queue's percentiles are compiled and release the GIL: they run on a second core
    # while the rest of the Report (the latency's and the GPU's percentiles among it) is
    # worked out here. (The queue's take longer than the latency's: at the seed's
    # 200,000 requests 1.1 ms against 0.74 ms, and the GPU's 0.19 ms.)
    queued = aside(partial(Stat.of_served_ns, sim.records, "queue", served))
    try:
        return _build_report(sim, closed_form, search, queued)
    finally:
        wait([queued])  # no work left running on the records


def _build_report(sim: Simulation, closed_form: ClosedForm | None,
                  search: tuple[SearchStep, ...],
                  queued: Future[Stat] | None) -> Report:
    s, r, svc = sim.scenario, sim.records, sim.service
    counts = r.counts
    mbs = s.batching.max_batch_size
    gpu = s.hardware.spec()

    rows_served, busy_ns, last_batch_end, hist = r.batch_totals()
    last_arrival = int(r.arrival_ns.max(initial=0))
    span_s = last_arrival / 1e9
    # the last instant (Records.last_end_ns), without its passes where nothing timed out
    end = max(last_arrival, last_batch_end) if not counts["timed_out"] else r.last_end_ns()
    duration_s = end / 1e9 if end > 0 else float("nan")
    # a recorded trace (a file or inline arrivals_s) offers its own rate; qps is unused then
    traced = s.workload.trace_csv is not None or bool(s.workload.arrivals_s)
    offered = s.workload.qps if not traced else (
        r.arrival_ns.size / span_s if span_s > 0 else float("nan"))

    histogram = {str(b): int(c) for b, c in enumerate(hist) if c}
    num_batches = int(r.batch_size.size)
    batching = BatchingStats(
        mean_batch_size=rows_served / num_batches if num_batches else float("nan"),
        batch_size_histogram=histogram,
        num_batches=num_batches,
        p50_batch_size=_hist_percentile(hist, 50),
        p99_batch_size=_hist_percentile(hist, 99),
    )

    busy_s = float(busy_ns) / 1e9
    rows = float(rows_served)
    sat = svc.saturated_rows_per_s(mbs)
    c = r.num_instances
    busy = busy_s / (c * duration_s)
    mfu = (rows * svc.flops_per_row / (duration_s * s.hardware.num_gpus * svc.peak_flops)
           if svc.flops_per_row and svc.peak_flops else None)
    shown = sorted({1, mbs, *(2**k for k in range(1, 17) if 2**k < mbs)})
    exec_s = svc.exec_s(np.array(shown))
    feeds = svc.feed(np.array(shown), mbs)
    mfus = svc.mfu(np.array(shown))
    gpu_stats = GpuStats(
        gpu=gpu.key,
        num_gpus=s.hardware.num_gpus,
        num_instances=c,
        busy_fraction=busy,
        batch_efficiency=rows / (sat * busy_s) if busy_s > 0 else float("nan"),
        effective_utilization=rows / (sat * c * duration_s),
        mfu=mfu,
        saturated_rows_per_s_per_instance=sat,
        batch_costs=tuple(
            BatchCost(b, float(t * 1e3), float(b / t), float(f),
                      None if mfus is None else float(mfus[i]))
            for i, (b, t, f) in enumerate(zip(shown, exec_s, feeds, strict=True))
        ),
    )

    # Latencies from the int64 nanosecond records, read in place (no array per request is
    # built unless a latency outside the GPU varies per request).
    all_served = counts["served"] == counts["arrivals"]  # the common case: no mask
    lat = s.latency
    fetch_const = lat.is_constant("feature_fetch")
    net_const = lat.is_constant("network")
    n_served = counts["served"]
    # queue + GPU is completion - arrival, kept in int64 when nothing else varies
    fe = sim.frontend_s
    e2e_ns = (Stat.of_served_ns(r, "end_to_end", n_served)
              if fetch_const and net_const and not fe.size else None)
    # the GPU's: each batch's time weighted by its size (the per-request GPU times, from
    # a fifth as many values)
    gpu_stat = Stat.of_ns_weighted(*r.batch_gpu_ns())
    queue_stat = (queued.result() if queued is not None
                  else Stat.of_served_ns(r, "queue", n_served))
    fetch_stat = (Stat.constant(lat.feature_fetch_ms) if fetch_const or not n_served
                  else Stat.of(sim.fetch_s if all_served else sim.fetch_s[r.served]))
    net_stat = (Stat.constant(lat.network_ms) if net_const or not n_served
                else Stat.of(sim.network_s if all_served else sim.network_s[r.served]))
    fe_stat = (Stat.constant(0.0) if not fe.size or not n_served
               else Stat.of(fe if all_served else fe[r.served]))
    e2e = e2e_ns if e2e_ns is not None else Stat.of(variable_latency_s(sim))
    if fetch_const or net_const:  # constants shift every percentile by the same amount
        shift = (lat.feature_fetch_ms if fetch_const else 0.0) + (
            lat.network_ms if net_const else 0.0)
        e2e = Stat(*(x + shift for x in (e2e.mean_ms, e2e.p50_ms, e2e.p90_ms, e2e.p95_ms,
                                          e2e.p99_ms)))
    latency = LatencyStats(
        mean_queue_ms=queue_stat.mean_ms,
        mean_ms=e2e.mean_ms, p50_ms=e2e.p50_ms, p90_ms=e2e.p90_ms, p95_ms=e2e.p95_ms,
        p99_ms=e2e.p99_ms,
        components={
            "frontend": fe_stat,
            "feature_fetch": fetch_stat,
            "queue": queue_stat,
            "gpu": gpu_stat,
            "network": net_stat,
            "end_to_end": e2e,
        },
    )

    # Throughput is what was served over the span in which it was served (from the start
    # of the run to the last completion): in overload the queue drains long after the last
    # arrival, and the offered rate would overstate it.
    served_span_s = float(last_batch_end) / 1e9
    served_per_s = counts["served"] / served_span_s if served_span_s > 0 else 0.0
    dropped = counts["rejected"] + counts["timed_out"]
    slo, ceiling = s.latency.p99_slo_ms, s.plan.max_busy_fraction
    ok = meets(e2e.p99_ms, busy, dropped, slo, ceiling)
    plan = PlanStats(
        num_gpus=s.hardware.num_gpus,
        price_per_gpu_hour_usd=gpu.price_per_gpu_hour_usd,
        cost_per_million_usd=cost_per_million(s.hardware.num_gpus, gpu.price_per_gpu_hour_usd,
                                              served_per_s),
        p99_slo_ms=slo,
        max_busy_fraction=ceiling,
        meets_slo=ok,
        verdict=_verdict(ok, e2e.p99_ms, busy, dropped, slo, ceiling),
        closed_form=closed_form,
        search=search,
    )
    notes = []
    if svc.kind.value == "profile" and mbs > max(svc.curve_b):
        notes.append(f"profile measured up to batch {max(svc.curve_b):g}; larger batches "
                     "are extrapolated from the last two points")
    if counts["arrivals"] < MIN_ARRIVALS_TO_JUDGE:
        notes.append(f"{counts['arrivals']} request(s): too few to tell whether the "
                     f"instances keep up (busy share and tails need at least "
                     f"{MIN_ARRIVALS_TO_JUDGE}); run more, e.g. --num-requests 2000")
    elif busy > 0.98 or end > 1.5e9 * span_s:
        notes.append("the instances cannot keep up: the queue grows for the whole run, "
                     "so latency depends on the run's length")
    if fe.size and counts["arrivals"] >= MIN_ARRIVALS_TO_JUDGE:
        cap = lat.frontend_workers / lat.frontend_ms * 1e3  # requests/s it can pass
        sent_s = float(sim.sent_ns[-1]) / 1e9  # the last request's arrival, before it
        offered = counts["arrivals"] / sent_s if sent_s > 0 else 0.0
        if offered > 0.98 * cap:
            notes.append(f"the front end cannot keep up: {offered:,.0f} requests/s offered "
                         f"to {lat.frontend_workers} worker(s) of {lat.frontend_ms:g} ms "
                         f"a request (at most {cap:,.0f}/s); its queue grows for the whole "
                         "run")
    if lat.stalls:
        lengths = lat.stall_lengths_ms
        mean_ms = sum(lengths) / len(lengths)
        paused = lat.stalls_per_s * mean_ms / 1e3
        notes.append(f"the whole server stalls {lat.stalls_per_s:g} times a second of its "
                     f"running time, {mean_ms:.3g} ms each on average: about "
                     f"{paused / (1 + paused):.1%} of the time its front end, batcher and "
                     "model stand still together")

    b = s.batching
    if 0 < b.default_timeout_microseconds < b.max_queue_delay_microseconds:
        notes.append(f"default_timeout_microseconds ({b.default_timeout_microseconds:,} us) is "
                     f"shorter than max_queue_delay_microseconds "
                     f"({b.max_queue_delay_microseconds:,} us): at low load a request waits "
                     "for the window and times out before its batch is sent; raise the "
                     "timeout above the window")
    return Report(
        scenario=scenario_to_dict(s),
        requests=RequestCounts(**counts),
        batching=batching,
        throughput=ThroughputStats(offered_qps=offered, served_per_s=served_per_s,
                                   duration_s=duration_s),
        gpu=gpu_stats,
        latency=latency,
        plan=plan,
        notes=tuple(notes),
    )
