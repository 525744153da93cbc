"""`servelab validate`: measure a v2 server, fit the simulator to it, and hold the
simulator's prediction against measurement at several rates.

1. **Policy** from the server's `/v2/models/{m}/config` (Triton's JSON form): max batch
   size, preferred sizes, max queue delay, queue policy, instance count.
2. **Profile** (closed loops, the server's per-batch-size statistics):
   - *rows*: one client sending requests of b rows, for b = 1, 2, 4 ... max_batch_size:
     each execution is one request of b rows, so the server's `batch_stats` give the
     time per batch of b rows;
   - *requests*: c clients sending one-row requests, for c = 2, 4 ... max_batch_size:
     batches of k one-row requests; what they take beyond k rows' time is the cost per
     request (``per_request_ms``, least squares through the origin);
   - *outside*: open-loop Poisson at 100 requests/s, one-row requests. The simulator,
     fitted to the profile alone, runs on the very arrival times that were sent, and
     each request's measured end-to-end time less its own simulated time inside the
     server is its time outside (client, HTTP, parsing). Pairing each request with its
     own simulated queue keeps the queueing spread inside, where the simulator puts it
     again (subtracting the server's *mean* time put it outside as well, and clipping
     the negative differences raised the mean; docs/load-and-validate.md). The
     samples are then shifted so their mean is the measured end-to-end mean less the
     server's measured mean queue + compute over the same requests (its statistics),
     and kept as samples so the measured tail reaches the prediction;
   - *probe*: one client sending one-row requests (a batch of one each time), in 8
     groups of 10: the median of the groups' mean time per execution. It runs again
     before each rate, so the report says how far the server's speed moved between
     profiling and measuring (on this shared machine: up to 30%).
3. **Fit**: a scenario with that profile, the server's policy and the outside samples.
4. **Measure and predict**: open-loop Poisson load at each rate (by default 20%, 50%
   and 80% of the open-loop saturation), and the simulator run on the very arrival
   times that were sent.
5. **Compare**: predicted vs measured mean batch, p50, p90, p99, mean queue and
   throughput, with % error and a verdict against stated tolerances; the compute time
   per request is set beside the server's own figure (not judged). A **diagnosis**
   runs the simulator once more with each batch size's execution time as the server's
   statistics measured it in that very run: what it recovers was the service-time
   profile, what still misses is the batching model or the time outside. Its times on
   the batches the server itself ran, against the server's compute, say how well they
   describe the run apart from the batching (`run_batches`).

Stated simplifications (they are in the report's notes):
- The spread of one batch's execution time cannot be told apart from the spread of the
  time outside the server with only a v2 server's statistics (they are sums), so the
  fitted service time is deterministic per batch size and all measured spread is in
  the outside time.
- The server's front end (HTTP parsing, the response) is a station before the batcher
  only where `--frontend-workers` gives it (by default with `--serve`: servelab's
  gateway, one event loop); its cost per request is the server's own time beyond queue
  and compute at low load (its statistics), which leaves out the HTTP layer before the
  server's clock starts. The rest of the time outside is measured at low load and does
  not grow with the rate.
"""

from __future__ import annotations

import asyncio
import glob
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from servelab.errors import InputError, StoreError, cut, invalid
from servelab.measure.client import fetch
from servelab.measure.gaps import gap_note
from servelab.measure.handoff import HandOff, handoff_note, read_handoff
from servelab.measure.load import (
    LoadStep,
    Target,
    cpu_times,
    cpu_use,
    measure_rate,
    random_bodies,
    server_stats,
)
from servelab.measure.loadgen import (
    LoadResult,
    http_request,
    poisson_offsets,
    refuse_silent,
    run_closed_loop,
    run_open_loop,
)
from servelab.measure.stability import Stability, last_spread
from servelab.measure.stall_fit import (
    SERIES_BLOCK,
    STALL_FACTOR,
    STALL_MIN_MS,
    StallFit,
    fit_stalls,
    speed_series,
)
from servelab.report import jsonable
from servelab.scenario import (
    MAX_BATCH,
    MAX_FRONTEND_WORKERS,
    MAX_STALLS_PER_S,
    BatchingPolicy,
    Scenario,
    flatten,
    scenario_from_dict,
    scenario_to_dict,
)
from servelab.trace_file import TraceRequests, read_trace

# Tolerances the verdict holds each figure to (relative error), as the project's
# fidelity target states them; mean queue is reported but not judged (it is a
# fraction of a millisecond at low load, where a relative error means little).
TOLERANCE = {"mean_batch": 0.10, "p50_ms": 0.10, "p90_ms": 0.15, "p99_ms": 0.20,
             "throughput_per_s": 0.05}
MAX_OUTSIDE_SAMPLES = 20_000
OUTSIDE_RATE = 100.0  # requests/s while measuring the time outside the server
HOST_BUSY_NOTE = 0.5  # a machine busier than this is noted: the client competes
SATURATION_SECONDS = 2.0  # of load per step while looking for saturation
# A step whose last third's median latency is this many times its first third's is
# past saturation: its queue grows through the run. A 2 s step of a server a few percent
# over capacity builds too little queue to show in the whole step's median (on a 16-core
# machine a search without this check passed 100% of the closed-loop rate, and a 10 s run
# at 80% of that then fell 186 ms behind).
SATURATION_GROWTH = 1.5
# Halvings of the gap between the last step kept up with and the first that fell behind:
# the saturation is found to 10% / 2**SATURATION_REFINE of the closed loop's rate. With
# the 10% steps alone, three runs on one quiet VM found 50% or 60% of the closed loop by
# chance (2,388-3,153/s, 2026-12-05), so "80% of saturation" fell anywhere from 1,910 to
# 2,520/s, and the prediction's error there moved with it.
SATURATION_REFINE = 2
MIN_BATCHES = 5  # executions of one size before its mean is a profile point
# Executions of one size in a loaded run before the diagnosis uses its time (5 was
# tried: sizes seen 5-19 times carried stalls into it, compute missing by 7-38%).
MIN_RUN_BATCHES = 20
MIN_CALIBRATION_BATCHES = 20  # the same for calibrating the profile that predicts
# --calibrate-at-rate: a warm-up run at each rate, this share of the rate's requests (at
# least WARMUP_MIN), its arrivals drawn from the rate's seed plus WARMUP_SEED
WARMUP_SHARE = 0.5
WARMUP_MIN = 100
WARMUP_SEED = 7_919
PROBE_REQUESTS = 80  # one-row requests, one client, per probe (about 0.3-0.5 s)
PROBE_GROUPS = 8  # the probe's figure is the median of this many groups' means
PROBE_SETTLE_S = 1.0  # pause before a probe, after a loaded run
STEAL_NOTE = 0.02  # a note when the hypervisor took more of the CPUs' time than this
WARM_GROUP = 20  # one-row requests per warm-up group
WARM_STEADY = 0.05  # warm once two groups' one-row batch times agree within this
WARM_MAX_S = 5.0  # ... or after this long


@dataclass(frozen=True, slots=True)
class ServerPolicy:
    policy: BatchingPolicy
    instances: int
    source: str  # where it came from: the server's config, or flags


def read_policy(t: Target, overrides: dict[str, int | None]) -> ServerPolicy:
    """The model's batching policy from its Triton-style config; flags fill or replace."""
    cfg: dict[str, Any] = {}
    try:
        r = fetch("GET", f"{t.base}/v2/models/{t.model}/config")
        doc = r.json() if r.status == 200 else None
        cfg = doc if isinstance(doc, dict) else {}
    except StoreError:
        cfg = {}
    def obj(v: Any) -> dict[str, Any]:  # a config is the server's word: checked, not trusted
        return v if isinstance(v, dict) else {}

    dyn = obj(cfg.get("dynamic_batching"))
    qp = obj(dyn.get("default_queue_policy"))
    groups = [obj(g) for g in cfg.get("instance_group") or [{}]] if isinstance(
        cfg.get("instance_group") or [], list) else [{}]
    found: dict[str, int | None] = {
        "max_batch_size": _int_or_none(cfg.get("max_batch_size")),
        "max_queue_delay_us": _int_or_none(dyn.get("max_queue_delay_microseconds", 0))
        if cfg else None,
        "max_queue_size": _int_or_none(qp.get("max_queue_size", 0)) if cfg else None,
        "timeout_us": _int_or_none(qp.get("default_timeout_microseconds", 0)) if cfg else None,
        "instances": sum(_int_or_none(g.get("count", 1)) or 1 for g in groups) if cfg else None,
    }
    raw_prefs = dyn.get("preferred_batch_size") or ()
    prefs = tuple(p for p in (_int_or_none(x) for x in (
        raw_prefs if isinstance(raw_prefs, list) else ())) if p is not None)
    given = {k: v for k, v in overrides.items() if v is not None}
    merged = {**found, **given}
    lacking = [k for k in ("max_batch_size", "max_queue_delay_us", "instances")
               if merged.get(k) is None]
    if lacking:
        raise InputError(
            f"--url = {t.base}: the server gives no Triton-style config for {t.model!r} "
            f"(GET /v2/models/{t.model}/config), so its {', '.join(lacking)} are unknown; "
            "fix: pass them, e.g. --max-batch-size 32 --max-queue-delay-us 2000 "
            "--instances 1")
    mbs = int(merged["max_batch_size"] or 0)
    if not 1 <= mbs <= MAX_BATCH:
        raise InputError(f"max_batch_size = {mbs}: the model does not batch (expected 1 to "
                         f"{MAX_BATCH}); validate measures dynamic batching, fix: a batching "
                         "model, or --max-batch-size")
    policy = BatchingPolicy(
        max_batch_size=mbs,
        max_queue_delay_microseconds=int(merged["max_queue_delay_us"] or 0),
        preferred_batch_size=tuple(p for p in prefs if 1 <= p <= mbs),
        max_queue_size=int(merged.get("max_queue_size") or 0),
        default_timeout_microseconds=int(merged.get("timeout_us") or 0),
        instances_per_gpu=int(merged["instances"] or 1),
    )
    source = "the server's config" if cfg and not given else (
        "flags" if not cfg else "the server's config, with " + ", ".join(given) + " from flags")
    return ServerPolicy(policy, policy.instances_per_gpu, source)


def _int_or_none(v: Any) -> int | None:
    if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
        return None
    try:
        n = int(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return n if -(2**62) < n < 2**62 else None


def batch_stats(t: Target) -> dict[int, tuple[int, int]] | None:
    """Per batch size (rows): executions and total compute ns (input + infer + output),
    from the server's Triton-style statistics; None where it has none."""
    try:
        rows = fetch("GET", f"{t.base}/v2/models/{t.model}/stats").json()[
            "model_stats"][0]["batch_stats"]
        out = {}
        for b in rows:
            parts = [b.get(k) or {} for k in ("compute_input", "compute_infer",
                                              "compute_output")]
            out[int(b["batch_size"])] = (int(parts[1].get("count", 0)),
                                         sum(int(p.get("ns", 0)) for p in parts))
        return out
    except (StoreError, KeyError, IndexError, ValueError, TypeError, AttributeError):
        return None


def _delta(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]
           ) -> dict[int, tuple[int, int]]:
    out = {}
    for b, (c, ns) in after.items():
        c0, ns0 = before.get(b, (0, 0))
        if c > c0:
            out[b] = (c - c0, ns - ns0)
    return out


def _sizes(mbs: int) -> list[int]:
    sizes, b = [], 1
    while b < mbs:
        sizes.append(b)
        b *= 2
    return [*sizes, mbs]


@dataclass(frozen=True, slots=True)
class SizeFit:
    """What a run's own batch times made of a profile (`with_sizes`): the time of each
    batch size it ran often enough (ms, by size), how often it ran each, the ratio of
    measured to profiled time there, and the run's line through them (intercept and
    slope per request, ms; None unless asked for and two sizes were seen)."""

    sizes_ms: dict[str, float]
    batches: dict[str, int]
    profile_scale: float
    trend_ms: tuple[float, float] | None

    def to_dict(self) -> dict[str, Any]:
        return {"sizes_ms": dict(self.sizes_ms), "batches": dict(self.batches),
                "profile_scale": self.profile_scale,
                "trend_ms": None if self.trend_ms is None else list(self.trend_ms)}


@dataclass(frozen=True, slots=True)
class Prediction:
    """The simulator's figures for one rate, on the arrivals the load generator intended
    (`predict`)."""

    mean_batch: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    queue_ms: float
    compute_ms: float
    throughput_per_s: float
    dropped: int

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class Check:
    """One figure at one rate: measured, predicted, the relative error, and whether it is
    within its tolerance (None where the figure is not judged or not measured)."""

    measured: float | None
    predicted: float | None  # None: the side held to the measurement lacks the figure
    error: float | None
    tolerance: float | None
    ok: bool | None

    def to_dict(self) -> dict[str, Any]:
        return {"measured": self.measured, "predicted": self.predicted, "error": self.error,
                "tolerance": self.tolerance, "ok": self.ok}


def checks_dict(checks: dict[str, Check]) -> dict[str, Any]:
    return {k: c.to_dict() for k, c in checks.items()}


@dataclass(frozen=True, slots=True)
class RunBatches:
    """The compute per request the fitted scenario gives the very batches a run made,
    against the server's own (`run_batches_compute`)."""

    measured_ms: float
    scenario_ms: float
    error: float | None
    batches: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"measured_ms": self.measured_ms, "scenario_ms": self.scenario_ms,
                "error": self.error, "batches": dict(self.batches)}


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The simulator again with a run's own batch times (`given_measured_compute`)."""

    fit: SizeFit
    run_batches: RunBatches | None
    compare: dict[str, Check]
    on_sent_times: dict[str, Check] | None = None  # mean batch, queue, compute only

    @property
    def profile_scale(self) -> float:
        return self.fit.profile_scale

    def to_dict(self) -> dict[str, Any]:
        return {**self.fit.to_dict(),
                "run_batches": None if self.run_batches is None else self.run_batches.to_dict(),
                "compare": checks_dict(self.compare),
                **({} if self.on_sent_times is None
                   else {"on_sent_times": checks_dict(self.on_sent_times)})}


@dataclass(frozen=True, slots=True)
class RateCheck:
    """One rate of a `validate` run: what the load measured, what the simulator predicted
    on the same arrivals, each figure held to its tolerance, and the diagnoses."""

    rate_per_s: float
    requests: int
    measured: LoadStep
    predicted: Prediction
    compare: dict[str, Check]
    closed_loop_profile: dict[str, Check] | None  # the uncalibrated profile's checks
    given_measured_compute: Diagnosis | None
    probe_drift: float = 1.0
    probe_ms: float | None = None
    # --calibrate-at-rate: the batch times of the warm-up run at this rate that the
    # prediction used (None: the profile's; also when the warm-up ran no size often
    # enough), and what the warm-up measured (None: no warm-up ran)
    warmup: SizeFit | None = None
    warmup_measured: LoadStep | None = None
    # the stalls the warm-up's trace showed (None: no trace read); the prediction
    # simulated them where it found any
    stalls: StallFit | None = None
    without_stalls: dict[str, Check] | None = None  # the same prediction without them
    # The front end at the rate (see frontend_scale): its costs as a multiple of the
    # low-load fit, read from the warm-up (1: as fitted), and the prediction with the
    # fitted costs (None: not read)
    frontend_scale: float = 1.0
    fixed_frontend: dict[str, Check] | None = None
    # where the warm-up's time went, phase by phase (measure/split.py): "measured" from
    # the gateway's trace and the load generator, "simulated" by the prediction's
    # scenario on the warm-up's send times; None without both
    warmup_split: dict[str, Any] | None = None
    # the hand-off between batches the warm-up's trace showed (measure/handoff.py; None:
    # not read), and the same prediction without it
    handoff: HandOff | None = None
    without_handoff: dict[str, Check] | None = None
    # the warm-up's batch times in their order, drawn in runs (stall_fit.speed_series;
    # None: not read): how many batches, their spread, and the prediction with each
    # size's mean time instead
    series: dict[str, float] | None = None
    without_series: dict[str, Check] | None = None

    def to_dict(self) -> dict[str, Any]:
        g = self.given_measured_compute
        return {"rate_per_s": self.rate_per_s, "requests": self.requests,
                "measured": self.measured.to_dict(), "predicted": self.predicted.to_dict(),
                "compare": checks_dict(self.compare),
                **({} if self.closed_loop_profile is None
                   else {"closed_loop_profile": checks_dict(self.closed_loop_profile)}),
                "given_measured_compute": None if g is None else g.to_dict(),
                **({} if self.without_stalls is None
                   else {"without_stalls": checks_dict(self.without_stalls)}),
                **({} if self.without_handoff is None
                   else {"without_handoff": checks_dict(self.without_handoff)}),
                **({} if self.without_series is None
                   else {"without_series": checks_dict(self.without_series)}),
                "frontend_scale": self.frontend_scale,
                **({} if self.fixed_frontend is None
                   else {"fixed_frontend": checks_dict(self.fixed_frontend)}),
                "probe_drift": self.probe_drift, "probe_ms": self.probe_ms,
                "warmup": None if self.warmup_measured is None else {
                    **({} if self.warmup is None else self.warmup.to_dict()),
                    "measured": self.warmup_measured.to_dict(),
                    "as_prediction": checks_dict(
                        warmup_as_prediction(self.measured, self.warmup_measured)),
                    "stalls": None if self.stalls is None else self.stalls.to_dict(),
                    "handoff": None if self.handoff is None else self.handoff.to_dict(),
                    "series": self.series,
                    "split": self.warmup_split}}


@dataclass(slots=True)
class Profile:
    rows_ms: dict[int, float] = field(default_factory=dict)  # batch of b rows, 1 request
    requests_ms: dict[int, float] = field(default_factory=dict)  # batch of k 1-row requests
    per_request_ms: float = 0.0
    outside_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    low_load_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    server_ms: float = 0.0  # mean queue + compute per request at low load
    # The server's own time per request beyond queue + compute at low load (its
    # statistics' success duration less those; None without them): work in its front end.
    handling_ms: float | None = None
    # The front end as a CPU station before the batcher ([latency] frontend_workers,
    # frontend_cpu_ms); 0 workers: the time outside is a pure delay, as measured at low load.
    frontend_workers: int = 0
    frontend_cpu_ms: float = 0.0
    frontend_event_loop: bool = False
    frontend_turn_ms: float = 0.0  # an event loop's cost per turn (see frontend_fit)
    frontend_answer_ms: float = 0.0  # an event loop's cost per answer (see frontend_fit)
    # The front end's speed at the rate predicted against its low-load fit: its costs
    # are this many times the fitted ones (see frontend_scale); the
    # time outside it stays as fitted at low load.
    frontend_scale: float = 1.0
    # The most one-row requests a second any closed loop of the profile had answered: its
    # front end carried them, which bounds the front end's cost (see frontend_fit).
    closed_loop_per_s: float = 0.0
    probe: Probe | None = None  # one-row batches, one client, just after profiling
    notes: list[str] = field(default_factory=list)
    # Set when the curve came from open-loop calibration runs (see `under_load`): the
    # batch sizes they ran, their times, and the closed-loop profile's scale elsewhere.
    calibration: SizeFit | None = None
    host_cpu_steal: float | None = None  # share of the CPUs' time the hypervisor took
    stalls: StallFit | None = None  # the whole server's stalls, simulated (see stall_fit)
    # how the server hands one batch over to the next, read from its trace (see
    # measure/handoff.py): each size's turnaround on top of its time, and the race
    handoff: HandOff | None = None
    # each batch's time over its size's mean, in the order a trace showed them
    # (stall_fit.speed_series): drawn in runs of SERIES_BLOCK, so the server's slow
    # stretches come back as stretches; empty: each size's mean time, every batch
    series: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def to_dict(self) -> dict[str, Any]:
        o = self.outside_ms
        return {
            "rows_ms": {str(k): v for k, v in sorted(self.rows_ms.items())},
            "requests_ms": {str(k): v for k, v in sorted(self.requests_ms.items())},
            "per_request_ms": self.per_request_ms,
            "outside_ms": {"samples": int(o.size),
                           "p50": float(np.percentile(o, 50)) if o.size else None,
                           "p99": float(np.percentile(o, 99)) if o.size else None,
                           "mean": float(o.mean()) if o.size else None},
            "server_ms_at_low_load": self.server_ms,
            "handling_ms_at_low_load": self.handling_ms,
            "closed_loop_per_s": self.closed_loop_per_s,
            "frontend": {"workers": self.frontend_workers, "cpu_ms": self.frontend_cpu_ms,
                         "event_loop": self.frontend_event_loop,
                         "turn_ms": self.frontend_turn_ms,
                         "answer_ms": self.frontend_answer_ms,
                         "scale": self.frontend_scale},
            "probe_ms": None if self.probe is None else self.probe.exec_ms,
            "calibration": None if self.calibration is None else self.calibration.to_dict(),
            "host_cpu_steal": self.host_cpu_steal,
        }


def _closed(t: Target, bodies: list[bytes], clients: int, n: int) -> Any:
    """A closed loop of `clients` sending `n` requests; refused when none was answered
    (a server that fails every request still counts its executions, and profiling them
    would fit the simulator to failures)."""
    reqs = [http_request(t.host, t.port, f"/v2/models/{t.model}/infer", b) for b in bodies]
    res = asyncio.run(run_closed_loop(t.host, t.port, reqs, clients, n))
    refuse_silent(res, t.base, f"the profile's closed loop of {clients} client(s)")
    if n and not (res.status == 200).any():
        raise StoreError(f"--url = {t.base}: none of {n} requests to {t.model!r} was "
                         f"answered; errors by reason: {cut(str(dict(res.errors)), 200)}; "
                         f"one again said: {_answer_to(t, bodies[0])}; fix: check the "
                         "server's log")
    return res


def _answer_to(t: Target, body: bytes) -> str:
    """The server's answer to one request, cut short: what a failing server says."""
    try:
        r = fetch("POST", f"{t.base}/v2/models/{t.model}/infer", body=body,
                  headers={"Content-Type": "application/json"})
    except StoreError as exc:
        return cut(str(exc), 200)
    return cut(f"HTTP {r.status} {r.head(200)}", 200)


def profile_server(t: Target, meta: dict[str, Any], sp: ServerPolicy, *,
                   per_step: int = 60, outside_n: int = 500, seed: int = 0,
                   say: Callable[[str], None] = lambda _: None) -> Profile:
    """Measure the per-batch-size profile, the per-request cost and the outside time."""
    mbs = sp.policy.max_batch_size
    prof = Profile()
    cpu0 = cpu_times()
    if batch_stats(t) is None:
        raise InputError(
            f"--url = {t.base}: the server gives no per-batch-size statistics "
            f"(GET /v2/models/{t.model}/stats with Triton's batch_stats), so validate cannot "
            "profile the model's execution time; fix: serve it with Triton or servelab serve")
    one = [b for b in random_bodies(meta, 64, seed) if isinstance(b, bytes)]
    prof.notes.extend(warm_up(t, one))
    # Rows: one client, requests of b rows.
    for b in _sizes(mbs):
        bodies = [x for x in random_bodies(meta, 8, seed + b, rows=b) if isinstance(x, bytes)]
        before = batch_stats(t) or {}
        _closed(t, bodies, 1, max(per_step // 2, 10))
        d = _delta(before, batch_stats(t) or {})
        if b in d and d[b][0] >= MIN_BATCHES // 2:
            prof.rows_ms[b] = d[b][1] / d[b][0] / 1e6
        say(f"profile: {b} row(s) per request: "
            f"{prof.rows_ms.get(b, float('nan')):.3f} ms per batch")
    if not prof.rows_ms:
        raise StoreError(f"--url = {t.base}: no executions were recorded in the server's "
                         "statistics while profiling; fix: check the model serves requests")
    # Requests: c clients of one-row requests make batches of up to c requests.
    totals: dict[int, list[int]] = {}
    for c in _sizes(mbs)[1:]:
        before = batch_stats(t) or {}
        res = _closed(t, one, c, per_step * c // 2 + 20)
        span_ns = int(res.done_ns.max() - res.intended_ns.min())
        if span_ns > 0:
            answered = int((res.status == 200).sum())
            prof.closed_loop_per_s = max(prof.closed_loop_per_s, answered * 1e9 / span_ns)
        for k, (cnt, ns) in _delta(before, batch_stats(t) or {}).items():
            acc = totals.setdefault(k, [0, 0])
            acc[0] += cnt
            acc[1] += ns
    prof.requests_ms = {k: ns / cnt / 1e6 for k, (cnt, ns) in totals.items()
                        if cnt >= MIN_BATCHES}
    xs, ys = [], []
    rb = sorted(prof.rows_ms)
    for k, ms in prof.requests_ms.items():
        if k >= 2:
            rows_k = float(np.interp(k, rb, [prof.rows_ms[b] for b in rb]))
            xs.append(k)
            ys.append(ms - rows_k)
    if xs:
        x, y = np.asarray(xs, float), np.asarray(ys, float)
        prof.per_request_ms = max(0.0, float((x @ y) / (x @ x)))
    say(f"profile: {prof.per_request_ms:.4f} ms per request beyond its rows "
        f"({len(xs)} batch sizes of one-row requests)")
    # Outside: open-loop Poisson at a low rate, as the measured rates will be sent (a
    # closed loop keeps every hop hot and finds less time outside than an open one).
    reqs = [http_request(t.host, t.port, f"/v2/models/{t.model}/infer", b) for b in one]
    offsets = poisson_offsets(OUTSIDE_RATE, outside_n, seed)
    s0 = server_stats(t)
    res = asyncio.run(run_open_loop(t.host, t.port, reqs, offsets))
    refuse_silent(res, t.base, f"the profile's low-load run ({OUTSIDE_RATE:g}/s)")
    s1 = server_stats(t)
    lat = res.latency_ms
    if lat.size == 0:
        raise StoreError(f"--url = {t.base}: none of the {offsets.size} requests of the "
                         f"low-load run ({OUTSIDE_RATE:g}/s, open loop) was answered; "
                         f"errors by reason: {cut(str(dict(res.errors)), 300)}; "
                         "fix: check the server's log")
    if s0 is None or s1 is None:
        raise StoreError(f"--url = {t.base}: the server's statistics (GET /v2/models/"
                         f"{t.model}/stats) did not answer around the low-load run; fix: "
                         "check the server's log")
    ok = max(s1["success"] - s0["success"], 1)
    server = sum(s1[k] - s0[k] for k in ("queue_ns", "input_ns", "infer_ns", "output_ns")
                 ) / ok / 1e6
    prof.server_ms = server
    if "success_ns" in s0:
        prof.handling_ms = max((s1["success_ns"] - s0["success_ns"]) / ok / 1e6 - server, 0.0)
    prof.low_load_ms = lat
    inside = (simulated_server_ms(fit_scenario(t, sp, prof, outside=False), offsets)
              if lat.size == offsets.size else np.full(lat.size, server))
    prof.outside_ms = outside_samples(lat, inside, server)[:MAX_OUTSIDE_SAMPLES]
    say(f"profile: outside the server p50 {np.percentile(prof.outside_ms, 50):.3f} ms, "
        f"mean {prof.outside_ms.mean():.3f} ms, p99 {np.percentile(prof.outside_ms, 99):.3f}"
        f" ms ({lat.size} requests)")
    prof.probe = probe(t, one)
    prof.host_cpu_steal = cpu_use(cpu0, cpu_times()).get("host_cpu_steal")
    return prof


def outside_samples(latency_ms: np.ndarray, inside_ms: np.ndarray, server_mean_ms: float
                    ) -> np.ndarray:
    """Time outside the server per request: measured end-to-end less the simulated time
    inside (paired by request), shifted so the mean is the measured end-to-end mean less
    the server's measured mean time; never below zero (a negative residual is the
    model's error on that request, not time outside). The shift is applied by scaling
    when clipping would otherwise raise the mean above the measured figure."""
    target = max(float(latency_ms.mean()) - server_mean_ms, 0.0)
    resid = latency_ms - inside_ms
    out: np.ndarray = np.maximum(resid - (resid.mean() - target), 0.0)
    if out.mean() > 0:  # clipping raised the mean: scale it back to the measured one
        out *= target / out.mean()
    floored: np.ndarray = np.maximum(out, 0.001)
    return floored


def on_arrivals(fit: Scenario, offsets_s: np.ndarray, seed: int = 0) -> Scenario:
    """The fitted scenario on the given arrival times (seconds from the first)."""
    return fit.with_overrides({"workload.arrival": "trace",
                               "workload.arrivals_s": [float(x) for x in offsets_s],
                               "workload.num_requests": int(offsets_s.size),
                               "workload.seed": seed})


def simulated_server_ms(fit: Scenario, offsets_s: np.ndarray) -> np.ndarray:
    """Each request's simulated queue + compute (ms) on the given arrival times."""
    from servelab.batching.simulate import simulate

    r = simulate(on_arrivals(fit, offsets_s)).records
    out: np.ndarray = (r.end_ns - r.arrival_ns) / 1e6
    return out


@dataclass(frozen=True, slots=True)
class Probe:
    """One client sending one-row requests (a batch of one each time), in groups: the
    server's mean time per execution in each group, from its statistics."""

    group_exec_ms: tuple[float, ...]

    @property
    def exec_ms(self) -> float:
        """The median of the groups' means: one stall moves one group, not the figure."""
        return float(np.median(self.group_exec_ms))


def probe(t: Target, one: list[bytes], n: int = PROBE_REQUESTS) -> Probe | None:
    """The server's time for a one-row batch now; None where it has no statistics.
    It waits PROBE_SETTLE_S first: right after a loaded run a server is still settling
    (measured: a probe then read 3-24% slower than one a moment later)."""
    time.sleep(PROBE_SETTLE_S)
    groups = []
    before = batch_stats(t)
    for _ in range(PROBE_GROUPS):
        _closed(t, one, 1, max(n // PROBE_GROUPS, 1))
        after = batch_stats(t)
        if before is None or after is None:
            return None
        d = _delta(before, after)
        if 1 in d:
            groups.append(d[1][1] / d[1][0] / 1e6)
        before = after
    return Probe(tuple(groups)) if len(groups) >= PROBE_GROUPS // 2 else None


def warm_up(t: Target, one: list[bytes]) -> list[str]:
    """One-row requests, one client, in groups of WARM_GROUP until two groups in a row
    take the same time per batch within WARM_STEADY, or WARM_MAX_S passes: the first
    executions of a fresh server (allocations, caches, a just-started backend's own
    work) are not the model's time. Measured: a real Triton's first profile in a test
    run read 65% slower than the same server a minute later, where 20 requests of
    warm-up had been the rule. A note if it never settled."""
    deadline = time.monotonic() + WARM_MAX_S
    last = None
    before = batch_stats(t)
    while time.monotonic() < deadline:
        _closed(t, one, 1, WARM_GROUP)
        after = batch_stats(t)
        d = _delta(before or {}, after or {})
        before = after
        if 1 not in d:
            return []  # no statistics per size: nothing to settle on
        now = d[1][1] / d[1][0]
        if last is not None and abs(now - last) <= WARM_STEADY * last:
            return []
        last = now
    return [f"the server's one-row batch time had not settled after {WARM_MAX_S:g} s of "
            "warm-up; the profile may read slow"]


def fitted_rows_ms(prof: Profile) -> dict[int, float]:
    """The per-batch curve the scenario carries (time for b rows, before the per-request
    term). Where batches of k one-row requests were measured directly, the curve there is
    that time minus k x per_request_ms, so the simulator reproduces the direct measurement
    for one-row traffic exactly; elsewhere it is the b-row requests' time."""
    out = dict(prof.rows_ms)
    for k, ms in prof.requests_ms.items():
        derived = ms - prof.per_request_ms * k
        if derived > 0:
            out[k] = derived
    if 1 in prof.rows_ms:  # one request of one row: measured as such
        out[1] = prof.rows_ms[1]
    return out


def fit_scenario(t: Target, sp: ServerPolicy, prof: Profile, *, outside: bool = True,
                 scale: float = 1.0) -> Scenario:
    """The scenario the simulator predicts with: measured profile (times `scale`), policy,
    outside time (none with `outside=False`: the server alone)."""
    p = sp.policy
    ho = prof.handoff
    points = [[b, round(max(ms * scale, 1e-6) + (ho.at(b) if ho else 0.0), 6)]
              for b, ms in sorted(fitted_rows_ms(prof).items())]
    raw: dict[str, Any] = {
        "name": f"validate-{t.model}",
        "description": (f"Fitted by servelab validate to {t.model} at {t.base}: profile, "
                        f"per-request cost and outside time measured; policy from {sp.source}"),
        "workload": {"qps": 100.0, "arrival": "poisson", "num_requests": 10_000, "seed": 0},
        "batching": {"max_batch_size": p.max_batch_size,
                     "max_queue_delay_microseconds": p.max_queue_delay_microseconds,
                     "preferred_batch_size": list(p.preferred_batch_size),
                     "max_queue_size": p.max_queue_size,
                     "default_timeout_microseconds": p.default_timeout_microseconds,
                     "instances_per_gpu": sp.instances,
                     "batcher_first": (ho.race if ho is not None and ho.race is not None
                                       else p.batcher_first)},
        "hardware": {"num_gpus": 1},
        "model": {"kind": "profile", "name": f"{t.model}, measured", "points": points,
                  "per_request_ms": round(prof.per_request_ms * scale, 6),
                  **({} if not prof.series.size else {
                      "variability": "empirical", "multiplier_block": SERIES_BLOCK,
                      "multipliers": [round(float(x), 5) for x in prof.series]})},
        "latency": {"network_samples_ms": outside_after_frontend(prof) if outside else [0.0],
                    "feature_fetch_ms": 0.0, "p99_slo_ms": 100.0},
    }
    if outside and prof.frontend_workers and (prof.frontend_cpu_ms or prof.frontend_answer_ms):
        k = prof.frontend_scale
        raw["latency"].update(frontend_workers=prof.frontend_workers,
                              frontend_cpu_ms=round(prof.frontend_cpu_ms * k, 6),
                              frontend_event_loop=prof.frontend_event_loop,
                              frontend_turn_ms=round(prof.frontend_turn_ms * k, 6),
                              frontend_answer_ms=round(prof.frontend_answer_ms * k, 6))
    if outside and prof.stalls is not None and prof.stalls.stalls:
        raw["latency"].update(stalls_per_s=round(min(prof.stalls.per_s, MAX_STALLS_PER_S), 6),
                              stall_samples_ms=list(prof.stalls.lengths_ms))
    return scenario_from_dict(raw, base_dir=None)


def trace_files(base: Path) -> list[Path]:
    """A trace's numbered files (`base`.N, as Triton and servelab's gateway write them
    with a log frequency), in the order written."""
    if not base.parent.is_dir():
        return []
    return sorted((p for p in base.parent.glob(glob.escape(base.name) + ".*")
                   if p.suffix[1:].isdigit() and p.stem == base.name),
                  key=lambda p: int(p.suffix[1:]))


def trace_window(base: Path, model: str, from_ns: int, to_ns: int, skip: int = 0
                 ) -> TraceRequests | None:
    """The requests in a server's trace (`base`.N: servelab's gateway's, or Triton's at
    level TIMESTAMPS) that entered its queue between two instants of this machine's
    monotonic clock (both traces are on that clock: Triton's steady clock is
    CLOCK_MONOTONIC on Linux), read from its files after the first `skip` (those written
    before `from_ns` hold none of them); None when it holds no such requests."""
    files = trace_files(base)[skip:]
    if not files:
        return None
    tr = read_trace(files, model)
    keep = (tr.queue_ns >= from_ns) & (tr.queue_ns <= to_ns)
    if not keep.any():
        return None
    return TraceRequests(tr.model, tr.queue_ns[keep], tr.start_ns[keep], tr.end_ns[keep], 0)


def trace_stalls(tr: TraceRequests) -> StallFit | None:
    """The stalls in a trace window's batches; None when no batch size ran often enough
    to have a usual time."""
    span_s = float(tr.end_ns.max() - tr.queue_ns.min()) / 1e9
    return fit_stalls(tr.start_ns, tr.end_ns, span_s)


def frontend_fit(prof: Profile) -> tuple[float, float]:
    """(ms a request, ms a turn) of the server's front end. At low load a request costs
    the server's own time per request beyond queue and compute (its statistics), else
    nothing. The profile's closed loops had more requests a second answered through the
    front end than that cost may allow (`prof.frontend_workers` / cost): then a request
    costs at most workers / that rate. For threads the rest is dropped (a stall in the
    low-load run: a busy CI run read 2.5 ms where the closed loop passed far more). For
    an event loop the rest is its cost per turn (its poll and wake-up): at low load a
    turn carries one request and costs both, under load many share it, as the closed
    loops saw."""
    cost = prof.handling_ms or 0.0
    if not prof.frontend_workers or prof.closed_loop_per_s <= 0:
        return cost, 0.0
    per_request = min(cost, prof.frontend_workers * 1000.0 / prof.closed_loop_per_s)
    return per_request, (cost - per_request if prof.frontend_event_loop else 0.0)


# The share of a request's time in servelab's gateway's event loop that is its answer
# (the batch delivered, the response built and written, when its batch ends) rather
# than its parse (the HTTP parse, the body read, the JSON parsed, the submit to the
# batcher). Measured on 2026-12-05 by bench/gateway_loop_split.py (every loop callback
# timed by side, the demo model at 330, 820 and 1,310/s on a 2-core AMD EPYC VM):
# 0.139/0.389, 0.145/0.361 and 0.154/0.372 ms, so 0.36-0.41.
ANSWER_SHARE = 0.4


def split_answer(prof: Profile, share: float) -> None:
    """An event loop's cost a request split into its parse and its answer (`share` of
    it), which the loop writes when the request's batch ends. An answer is a turn of its
    own (the batch's delivery wakes the loop), so at low load a request takes two turns
    where the fit saw one: each turn gets half the fitted cost a turn, so the two add up
    to the low-load cost again."""
    cost = prof.frontend_cpu_ms
    prof.frontend_cpu_ms, prof.frontend_answer_ms = cost * (1.0 - share), cost * share
    if share > 0:
        prof.frontend_turn_ms /= 2


def frontend_fit_notes(prof: Profile) -> list[str]:
    """What `frontend_fit` did with the low-load cost, when the closed loops bounded it."""
    if prof.handling_ms is None or prof.frontend_cpu_ms >= prof.handling_ms:
        return []
    said = (f"the server's own time per request beyond queue and compute at low load read "
            f"{prof.handling_ms:.3f} ms, more than a request may take in its front end to "
            f"pass the {prof.closed_loop_per_s:.0f} requests/s its closed loops had "
            f"answered: {prof.frontend_cpu_ms:.3f} ms a request")
    if prof.frontend_event_loop:
        return [said + f" and {prof.frontend_turn_ms:.3f} ms a turn of the event loop "
                "(shared by the requests a turn carries under load)"]
    return [said + "; the rest is left out (a stall in the low-load run: measure on a "
            "quieter machine, or give --frontend-cpu-ms)"]


def outside_after_frontend(prof: Profile) -> list[float]:
    """The time outside the server as samples (ms), less the front end's work where the
    scenario has a front-end station: the station adds that work (and its wait) itself,
    so at low load the two together give the measured time outside again."""
    if not prof.outside_ms.size:
        return [0.0]
    # (frontend_fit gives a cost per turn and per answer to an event loop only; an
    # answer takes a turn of its own, see split_answer)
    turns = 2 if prof.frontend_answer_ms else 1
    cpu = (prof.frontend_cpu_ms + turns * prof.frontend_turn_ms + prof.frontend_answer_ms
           if prof.frontend_workers else 0.0)
    return [round(max(float(x) - cpu, 0.001), 4) for x in prof.outside_ms]


def saturation(t: Target, meta: dict[str, Any], sp: ServerPolicy, low_load_p50_ms: float,
               seed: int = 0, say: Callable[[str], None] = lambda _: None
               ) -> tuple[float, float, dict[int, tuple[int, int]]]:
    """(open-loop saturation, closed-loop throughput in requests/s, and the server's
    per-batch-size executions and compute ns summed over the open-loop steps it kept up
    with: the calibration `under_load` turns into a profile).

    A closed loop with enough clients to fill every instance's batches gives the most
    the server answers when requests are always waiting; open-loop arrivals cost the
    client and the server's front end more per request, so that overstates what an
    open loop sustains. The open-loop saturation is found by stepping the offered rate
    up (2 s each, 10% of the closed-loop figure a step) until the server falls behind:
    it answers under 97% of the rate its send times drew (not of the nominal rate: a 2 s
    Poisson draw's span alone varies by ~3%), its median latency passes 3x the low-load
    median, or its last third's median is SATURATION_GROWTH times its first third's (its
    queue grows through the run). A step that falls behind is run once more on other
    send times and counts only if that falls behind too, so a chance stall stops the
    search only if it strikes twice running. The gap between the last step kept up with
    and the first that fell behind is then halved SATURATION_REFINE times.
    """
    one = [b for b in random_bodies(meta, 64, seed) if isinstance(b, bytes)]
    clients = min(2 * sp.policy.max_batch_size * sp.instances, 512)
    probe = _closed(t, one, clients, clients * 10)
    rate = probe.summary()["achieved_per_s"]
    n = int(min(max(rate * SATURATION_SECONDS, clients * 20), 200_000))
    closed = float(_closed(t, one, clients, n).summary()["achieved_per_s"])
    say(f"validate: closed loop ({clients} clients): {closed:.0f} requests/s")
    bodies = random_bodies(meta, 256, seed)
    kept: dict[int, tuple[int, int]] = {}

    def step(offered: float, step_seed: int) -> bool:
        before = batch_stats(t)
        row = measure_rate(t, bodies, offered, max(int(offered * SATURATION_SECONDS), 100),
                           step_seed, 256)
        after = batch_stats(t)
        behind = falls_behind(row, low_load_p50_ms)
        say(f"validate: open loop {offered:.0f}/s (drew {row['drawn_per_s']:.0f}/s): served "
            f"{row['achieved_per_s']:.0f}/s, p50 {row['p50_ms']:.2f} ms"
            f"{' (falls behind)' if behind else ''}")
        if not behind and before is not None and after is not None:
            for b, (c, ns) in _delta(before, after).items():
                c0, ns0 = kept.get(b, (0, 0))
                kept[b] = (c0 + c, ns0 + ns)
        return not behind

    def keeps_up(offered: float, k: int) -> bool:
        return step(offered, seed + 100 + k) or step(offered, seed + 1000 + k)

    def refine(ok: float, behind: float) -> float:
        """Bisect between a rate kept up with and one that fell behind."""
        for h in range(SATURATION_REFINE):
            mid = (ok + behind) / 2
            if keeps_up(mid, 40 + h):
                ok = mid
            else:
                behind = mid
        return ok

    # Up from 30% of the closed-loop figure in 10% steps. If even 30% falls behind (a
    # closed loop overstates an open loop most on a small, shared machine), down by
    # halves, so that the saturation and the calibration come from a rate it kept up with.
    # Either way the last gap is then bisected (`refine`).
    last_ok = 0.0
    for k in range(3, 16):
        offered = closed * k / 10
        if keeps_up(offered, k):
            last_ok = offered
            continue
        if last_ok:
            return refine(last_ok, offered), closed, kept
        for h in range(1, 4):
            lower = closed * 0.3 / 2 ** h
            if keeps_up(lower, 20 + h):
                return refine(lower, offered), closed, kept
            offered = lower
        return offered, closed, kept
    return last_ok, closed, kept


def falls_behind(row: dict[str, Any], low_load_p50_ms: float) -> bool:
    """Whether an open-loop step ran past what the server sustains (see `saturation`)."""
    return bool(row["achieved_per_s"] < 0.97 * row["drawn_per_s"]
                or not row["p50_ms"] <= 3 * low_load_p50_ms
                or row["p50_growth"] > SATURATION_GROWTH)


def predict(fit: Scenario, offsets_s: np.ndarray, seed: int) -> Prediction:
    """The simulator on the same arrival times the load generator intended."""
    from servelab.api import run_simulate

    r = run_simulate(on_arrivals(fit, offsets_s, seed))
    return Prediction(r.batching.mean_batch_size, r.latency.p50_ms, r.latency.p90_ms,
                      r.latency.p99_ms, r.latency.mean_ms, r.latency.mean_queue_ms,
                      r.latency.components["gpu"].mean_ms, r.throughput.served_per_s,
                      r.requests.rejected + r.requests.timed_out)


def compare(measured: LoadStep, predicted: Prediction) -> dict[str, Check]:
    """Per figure: measured, predicted, relative error, and whether it is in tolerance."""
    m = {"mean_batch": measured.server.get("mean_batch"), "p50_ms": measured.p50_ms,
         "p90_ms": measured.p90_ms, "p99_ms": measured.p99_ms, "mean_ms": measured.mean_ms,
         "queue_ms": measured.server.get("server_queue_ms"),
         "compute_ms": measured.server.get("server_compute_ms"),
         "throughput_per_s": measured.achieved_per_s}
    return {k: judged(k, meas, getattr(predicted, k)) for k, meas in m.items()}


def judged(key: str, measured: float | None, predicted: float | None) -> Check:
    """One figure held to its tolerance: its relative error, and whether it is within
    TOLERANCE[key] (None where the figure is not judged or either side is missing)."""
    err = ((predicted - measured) / measured
           if measured is not None and predicted is not None and measured != 0
           and math.isfinite(measured) and math.isfinite(predicted) else None)
    tol = TOLERANCE.get(key)
    return Check(measured, predicted, err, tol,
                 None if tol is None or err is None else abs(err) <= tol)


REPEAT_KEYS = ("mean_batch", "p50_ms", "p99_ms")  # the figures the target holds


def warmup_as_prediction(run: LoadStep, warm: LoadStep) -> dict[str, Check]:
    """The warm-up at a rate held to the run at the same rate, as if it were the
    prediction: whether the measurement repeats itself. Both ran on the same server at
    the same rate moments apart, so where the warm-up misses a tolerance, no prediction
    made before the run (from the warm-up or anything else measured then) can be judged
    on that rate's figures more finely than the measurement itself varies."""
    def fig(step: LoadStep, k: str) -> float | None:
        return step.server.get(k) if k == "mean_batch" else getattr(step, k)
    return {k: judged(k, fig(run, k), fig(warm, k)) for k in REPEAT_KEYS}


def drift_scale(prof: Profile, now: Probe | None) -> float:
    """How much slower (>1) or faster the server's time per batch is now than when it
    was profiled: the probe now over the profile's probe; 1 without probes. Reported,
    not applied (a closed-loop probe did not track the speed under open-loop load)."""
    if prof.probe is None or now is None:
        return 1.0
    return now.exec_ms / prof.probe.exec_ms


def with_sizes(prof: Profile, counts: dict[int, tuple[int, int]], min_batches: int, *,
               trend: bool = False) -> tuple[Profile, SizeFit] | None:
    """`prof` with the time of each batch size the server ran (`counts`: executions and
    compute ns per size, batches of one-row requests, sizes seen `min_batches` times or
    more) in place of its own. Its other sizes take its whole time (curve and
    per-request term) scaled by the count-weighted ratio of measured to profiled time at
    the sizes seen (`profile_scale`), or with `trend`, where two sizes or more were
    seen, the count-weighted least-squares line through the measured times (`trend_ms`:
    intercept and slope per request). None if no size was seen often enough."""
    seen = {k: ns / cnt / 1e6 for k, (cnt, ns) in counts.items() if cnt >= min_batches}
    if not seen:
        return None
    base = fitted_rows_ms(prof)
    sizes = sorted(base)
    per_req = prof.per_request_ms
    # The profile's time for k one-row requests, where the server ran them
    model = {k: float(np.interp(k, sizes, [base[b] for b in sizes])) + per_req * k
             for k in seen}
    weight = {k: counts[k][0] for k in seen}
    scale = (sum(weight[k] * seen[k] for k in seen)
             / sum(weight[k] * model[k] for k in seen))
    line = _trend(seen, weight) if trend else None
    if line is None:  # time(b) = scale x (rows(b) + b x per_request), less b x per_request
        rows = {b: max(ms * scale + (scale - 1) * per_req * b, 1e-6) for b, ms in base.items()}
    else:
        rows = {b: max(line[0] + line[1] * b - per_req * b, 1e-6) for b in base}
    for k, ms in seen.items():
        rows[k] = max(ms - per_req * k, 1e-6)  # the measured time for k requests
    # (no requests_ms: fitted_rows_ms would put the profile's own times back at them)
    out = replace(prof, rows_ms=rows, requests_ms={}, notes=list(prof.notes),
                  calibration=None)
    info = SizeFit({str(k): v for k, v in sorted(seen.items())},
                   {str(k): weight[k] for k in sorted(seen)}, scale, line)
    return out, info


def _trend(seen: dict[int, float], weight: dict[int, int]) -> tuple[float, float] | None:
    """The count-weighted least-squares line time = a + c x k through the measured time
    of each batch size k (c at least 0); None with fewer than two sizes."""
    if len(seen) < 2:
        return None
    k = np.array(sorted(seen), dtype=np.float64)
    t = np.array([seen[int(x)] for x in k])
    w = np.array([weight[int(x)] for x in k], dtype=np.float64)
    km, tm = np.average(k, weights=w), np.average(t, weights=w)
    slope = max(float(np.sum(w * (k - km) * (t - tm)) / np.sum(w * (k - km) ** 2)), 0.0)
    return float(tm - slope * km), slope


def under_load(prof: Profile, calibration: dict[int, tuple[int, int]]) -> Profile:
    """The profile the prediction uses: the closed-loop profile recalibrated by what the
    server's batches took under open-loop load (the saturation search's steps below
    saturation, separate runs before any measured rate). A closed loop keeps a request
    waiting for each answer, which can leave the server idle or busy between batches
    unlike open-loop traffic. Measured with servelab's gateway on 16-core machines
    (validate --client-cpus apart from --server-cpus): on one, one-row batches took
    2.0-2.5 ms closed-loop and 1.66 ms under open-loop load; on two others the two agreed
    within 3%. Unchanged when the calibration ran no size often enough."""
    got = with_sizes(prof, calibration, MIN_CALIBRATION_BATCHES)
    if got is None:
        return prof
    out, info = got
    out.calibration = info
    return out


def given_measured_compute(t: Target, sp: ServerPolicy, prof: Profile,
                      in_run: dict[int, tuple[int, int]], offsets: np.ndarray, seed: int,
                      measured: LoadStep, sent_s: np.ndarray | None = None
                      ) -> Diagnosis | None:
    """A diagnosis, not a prediction: the simulator again, with the time of each batch size
    the server ran in this very run (its statistics' deltas: batches of k one-row
    requests, each size seen at least MIN_RUN_BATCHES times) in place of the profile's,
    and at the sizes the run made rarely or not at all, the run's own count-weighted line
    through those times (`trend_ms`; the profile scaled by one ratio, `profile_scale`,
    where the run made a single size often enough). Only execution times go in; batches,
    queues and latencies come out. What still misses then is the batching model or the
    time outside; what this recovers was the service-time profile (on this shared
    machine the server's speed under load moves 5-13% from its profile, measured, and
    the closed-loop profile's shape departed from the run's by 17-21% at 2 and 4
    requests on PyTriton's Triton: scaled by one ratio it left compute 3-5% short at
    400/s).

    With `sent_s`, the times (s) the requests actually left the client, sorted: the same
    simulation on those (`on_sent_times`: mean batch, server queue and compute, the
    figures that do not count from the intended send time). A client that sends late
    in bursts bunches requests into bigger batches than its intended times would make;
    what this recovers was the load generator, not the server."""
    got = with_sizes(prof, in_run, MIN_RUN_BATCHES, trend=True)
    if got is None:
        return None
    run_prof, info = got
    fit = fit_scenario(t, sp, run_prof)
    pred = predict(fit, offsets, seed)
    on_sent = None
    if sent_s is not None and sent_s.size:
        every = compare(measured, predict(fit, sent_s, seed))
        on_sent = {k: every[k] for k in ("mean_batch", "queue_ms", "compute_ms")}
    return Diagnosis(info, run_batches_compute(fit, in_run), compare(measured, pred), on_sent)


def run_batches_compute(fit: Scenario, in_run: dict[int, tuple[int, int]]
                        ) -> RunBatches | None:
    """What went in, apart from the batching: the compute per request the scenario gives
    the very batches the server ran (every size, as often as the server ran it; each
    request credited its batch's time, as Triton counts it) against the server's own.
    The simulated compute per request also depends on the batches the simulator forms
    (a batch of 5 takes longer than one of 2), so it misses with the batching too; this
    does not. None without batches of one-row requests the scenario can run."""
    from servelab.batching.service import build_service_model, exec_table_ns

    mbs = fit.batching.max_batch_size
    runs = {k: v for k, v in in_run.items() if 1 <= k <= mbs and v[0] > 0}
    if not runs:
        return None
    table = exec_table_ns(build_service_model(fit.model, fit.hardware.spec(), mbs,
                                              fit.resolve_path), mbs)
    requests = sum(k * c for k, (c, _) in runs.items())
    measured = sum(k * ns for k, (_, ns) in runs.items()) / requests / 1e6
    scenario = sum(k * c * float(table[k]) for k, (c, _) in runs.items()) / requests / 1e6
    return RunBatches(measured, scenario,
                      (scenario - measured) / measured if measured > 0 else None,
                      {str(k): c for k, (c, _) in sorted(runs.items())})


def measure_and_predict(t: Target, meta: dict[str, Any], sp: ServerPolicy, prof: Profile,
                        rate: float, n: int, seed: int, closed_loop: Profile | None = None,
                        at_rate: bool = False, trace: Path | None = None,
                        stability: Stability | None = None,
                        frontend_at_rate: bool = False, stalls_on: bool = True,
                        handoff: bool = True, race: bool = True,
                        series: bool = True) -> RateCheck:
    """One rate: probe, open-loop Poisson load, then the prediction on the same arrivals,
    and the diagnosis with the run's own measured compute time. With `closed_loop` (the
    profile before calibration under load), its prediction too, for reference.

    With `at_rate` (--calibrate-at-rate), a warm-up run at the same rate comes first
    (`warmup_at_rate`), and the prediction takes the batch times the server showed in it
    in place of the profile's, as the diagnosis takes the run's own: the server's speed
    under this very load, measured seconds before the run rather than minutes (on the
    2-core VM the gateway's one-row batch moved x0.81-1.26 between its profile and a
    rate a minute later, 2026-12-03). The profile's own prediction is kept beside it
    (`closed_loop_profile`).

    With `trace` (the base path of the server's trace: the gateway's validate started,
    or Triton's, --trace-file), the warm-up's batches are read from the trace: with
    `stalls_on`, its stalls (`stall_fit`) go into the prediction, and the batch times it
    takes are theirs with the stalls taken out; with `handoff`, the instance's turnaround
    between batches and (with `race`) the completion race (measure/handoff.py).

    With `stability` on (--stability-percentage), the run is windows until the last three
    agree, as perf_analyzer measures (measure/stability.py); the measurement is those
    three joined end to end, and the prediction and the diagnosis run on their send
    times and batches."""
    bodies = random_bodies(meta, 256, seed)
    one = [b for b in random_bodies(meta, 64, seed) if isinstance(b, bytes)]
    offsets = poisson_offsets(rate, n, seed)
    now = probe(t, one) if prof.probe is not None else None
    written = len(trace_files(trace)) if trace is not None else 0
    warm_from = time.monotonic_ns()
    warm_step, warm, warm_res = (warmup_at_rate(t, bodies, prof, rate, n, seed) if at_rate
                                 else (None, None, None))
    warm_to = time.monotonic_ns()
    sent: list[np.ndarray] = []
    intended: list[np.ndarray] = []

    def kept(res: LoadResult) -> None:
        sent.append(np.sort(np.maximum(res.sent_ns, res.intended_ns)) / 1e9)  # (never
        intended.append(np.sort(res.intended_ns) / 1e9)  # before intended)

    row = measure_rate(t, bodies, rate, n, seed, 256, offsets=offsets, on_result=kept,
                       stability=stability, around=lambda: batch_stats(t))
    measured = LoadStep.of(row)
    in_run = _summed_deltas(row["around"])
    if measured.stability is not None and measured.stability["windows"] > 1:
        offsets = intended[0]  # the kept windows, end to end (one window: as drawn)
    drift = drift_scale(prof, now)
    stalls = no_stalls = ho = no_handoff = None
    warm_trace = (trace_window(trace, t.model, warm_from, warm_to, skip=written)
                  if trace is not None and warm_step is not None  # (the run has
                  else None)  # flushed its part)
    if warm_trace is not None and handoff:
        p = sp.policy
        ho = read_handoff(warm_trace, p.max_batch_size, p.max_queue_delay_microseconds
                          * 1000, sp.instances, race)

    def handed(pr: Profile) -> Profile:
        return pr if ho is None else replace(pr, handoff=ho)

    if warm_trace is not None and stalls_on:
        stalls = trace_stalls(warm_trace)
        stalled = (None if stalls is None or not stalls.stalls
                   else with_sizes(prof, stalls.clean, MIN_RUN_BATCHES, trend=True))
        if stalled is not None:  # the prediction as it was without them, for reference
            no_stalls = compare(measured, predict(fit_scenario(
                t, sp, handed(prof if warm is None else warm[0])), offsets, seed))
            stalled[0].stalls = stalls
            warm = stalled
    used = handed(prof if warm is None else warm[0])
    drawn = None
    if warm_trace is not None and series:
        ser = speed_series(warm_trace.start_ns, warm_trace.end_ns,
                           clean=used.stalls is not None and bool(used.stalls.stalls))
        if ser.size and float(ser.sum()) > 0:
            used = replace(used, series=ser)
            drawn = {"batches": int(ser.size), "cv": float(ser.std() / ser.mean()),
                     "block": SERIES_BLOCK}
    fixed_frontend = None
    if frontend_at_rate and warm_step is not None and used.frontend_workers:
        k = frontend_scale(t, sp, used, warmup_offsets(rate, n, seed), seed,
                           warm_step.p50_ms)
        fixed_frontend = compare(measured, predict(fit_scenario(t, sp, used), offsets, seed))
        used = replace(used, frontend_scale=k)
    predicted = predict(fit_scenario(t, sp, used), offsets, seed)
    if ho is not None:  # (with the front end's scale as read with the hand-off)
        no_handoff = compare(measured, predict(fit_scenario(
            t, sp, replace(used, handoff=None)), offsets, seed))
    no_series = None if drawn is None else compare(measured, predict(fit_scenario(
        t, sp, replace(used, series=np.zeros(0))), offsets, seed))
    split = None
    if warm_trace is not None and warm_res is not None:
        from servelab.batching.simulate import simulate
        from servelab.measure.split import measured_split, simulated_split

        measured_parts = measured_split(warm_res, warm_trace)
        simulated_parts = simulated_split(simulate(on_arrivals(
            fit_scenario(t, sp, used), warmup_offsets(rate, n, seed), seed)))
        if measured_parts is not None and simulated_parts is not None:
            split = {"measured": measured_parts, "simulated": simulated_parts}
    base = closed_loop if closed_loop is not None else (prof if warm is not None else None)
    uncalibrated = None if base is None else compare(
        measured, predict(fit_scenario(t, sp, base), offsets, seed))
    return RateCheck(
        rate, n, measured, predicted, compare(measured, predicted), uncalibrated,
        # (on the closed-loop profile: the run's own times replace it where the run made
        # a size often enough, as they would replace the calibration's)
        given_measured_compute(t, sp, handed(closed_loop or prof), in_run, offsets, seed,
                               measured, sent_s=sent[0] if sent else None),
        drift, None if now is None else now.exec_ms, None if warm is None else warm[1],
        warm_step, stalls, no_stalls, used.frontend_scale, fixed_frontend, split, ho,
        no_handoff, drawn, no_series)


def _summed_deltas(pairs: list[tuple[Any, Any]]) -> dict[int, tuple[int, int]]:
    """The server's per-size batch counts over the kept windows (`measure_rate`'s
    row["around"]); empty where it keeps none."""
    out: dict[int, tuple[int, int]] = {}
    for before, after in pairs:
        if before is None or after is None:
            return {}
        for k, (c, ns) in _delta(before, after).items():
            c0, ns0 = out.get(k, (0, 0))
            out[k] = (c0 + c, ns0 + ns)
    return out


FRONTEND_SCALE_RANGE = (0.25, 4.0)


def frontend_scale(t: Target, sp: ServerPolicy, prof: Profile, offsets_s: np.ndarray,
                   seed: int, measured_p50_ms: float) -> float:
    """The front end at the rate (validate's default with a front-end station and a
    warm-up; --no-frontend-at-rate: off): the multiple of its fitted costs with which the
    simulator, on the warm-up's own send times, gives the warm-up's measured median
    latency (bisection; the median grows with the multiple).

    On two cores shared by the client, the event loop, the batcher and the model, the
    loop's work takes longer under load than alone: on the Intel VM at 80% of saturation
    the multiple read 1.08-1.26 (2026-12-06). The median, not the mean: the tail is the
    stalls' (simulated apart), and a mean held to a noisy tail read the multiple higher
    and the batches bigger. Over 81 rates on two VMs (2026-12-05 and -06, scaled to the
    mean then) the prediction met issue 28's target at 40 rates with the multiple and 31
    with the fitted costs (docs/load-and-validate.md); the batches it makes run 6-9% big
    at 80% of saturation, where the fitted costs gave them within 3% (2026-12-06)."""
    def p50_at(k: float) -> float:
        return predict(fit_scenario(t, sp, replace(prof, frontend_scale=k)), offsets_s,
                       seed).p50_ms

    lo, hi = FRONTEND_SCALE_RANGE
    if p50_at(lo) >= measured_p50_ms:
        return lo
    if p50_at(hi) <= measured_p50_ms:
        return hi
    for _ in range(12):  # to 0.1% of the range
        mid = (lo + hi) / 2
        if p50_at(mid) < measured_p50_ms:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def warmup_offsets(rate: float, n: int, seed: int) -> np.ndarray:
    """The warm-up's send times for a rate of `n` requests: WARMUP_SHARE of them (at least
    WARMUP_MIN), drawn from seed + WARMUP_SEED."""
    m = max(WARMUP_MIN, min(int(n * WARMUP_SHARE), n))
    return poisson_offsets(rate, m, seed + WARMUP_SEED)


def warmup_at_rate(t: Target, bodies: list[bytes | tuple[bytes, int]], prof: Profile,
                   rate: float, n: int, seed: int
                   ) -> tuple[LoadStep, tuple[Profile, SizeFit] | None, LoadResult | None]:
    """--calibrate-at-rate: an open-loop run at `rate` of WARMUP_SHARE of the rate's `n`
    requests (its own arrivals, seed + WARMUP_SEED): what it measured, and `prof` with
    the batch times the server showed in it (`with_sizes` as the diagnosis uses it: each
    size run MIN_RUN_BATCHES times or more as measured, the others on the warm-up's line
    through them), None where the server has no statistics or ran no size that often; and
    its per-request result."""
    offsets = warmup_offsets(rate, n, seed)
    before = batch_stats(t)
    results: list[LoadResult] = []
    step = LoadStep.of(measure_rate(t, bodies, rate, offsets.size, seed + WARMUP_SEED, 256,
                                    offsets=offsets, on_result=results.append))
    after = batch_stats(t)
    res = results[0] if results else None
    if before is None or after is None:
        return step, None, res
    return step, with_sizes(prof, _delta(before, after), MIN_RUN_BATCHES, trend=True), res


# An open-loop saturation under this share of the closed loop's rate is flagged: an open
# loop costs the client and the front end more per request, but not half the throughput
# on a server that batches.
SATURATION_FAR_BELOW = 0.5


def saturation_notes(sat: float | None, closed: float | None) -> list[str]:
    if sat is None or not closed or sat >= SATURATION_FAR_BELOW * closed:
        return []
    return [f"the open-loop saturation found ({sat:.0f}/s) is {sat / closed:.0%} of the "
            f"closed loop's {closed:.0f}/s: the server fell behind even at low rates (a "
            "busy machine, a stall, or a client that cannot send this fast); the rates "
            "judged are shares of it, so check them, or give them with --rates"]


def warmup_notes(rows: list[RateCheck], asked: bool) -> list[str]:
    """What --calibrate-at-rate did at each rate: the warm-up's batch times and how far
    they were from the profile, or that it could not calibrate (no statistics, or no
    batch size run MIN_RUN_BATCHES times)."""
    if not asked:
        return []
    out = []
    for r in rows:
        at = f"at {r.rate_per_s:g}/s"
        w, m = r.warmup, r.warmup_measured
        if m is not None and m.errors:
            out.append(f"{at} the warm-up had {m.errors} failed request(s) of {m.requests} "
                       f"(by reason: {cut(str(m.errors_by_reason), 200)}): its batch times "
                       "are those of a server that failed some requests")
        if w is None:
            out.append(f"{at} the warm-up ran no batch size {MIN_RUN_BATCHES} times or more "
                       "(or the server keeps no statistics): predicted from the profile")
            continue
        sizes = ", ".join(f"{k}: {v:.3f} ms" for k, v in w.sizes_ms.items())
        out.append(f"{at} predicted with the batch times of a warm-up at this rate just "
                   f"before it ({sizes}; x{w.profile_scale:.2f} of the profile there); "
                   "closed_loop_profile holds the profile's own prediction")
        out.extend(stall_notes(r, at))
        out.extend(handoff_note(r.handoff, at))
        if r.warmup_split is not None:
            from servelab.measure.split import split_note
            out.append(split_note(at, r.warmup_split["measured"],
                                  r.warmup_split["simulated"]))
        if r.fixed_frontend is not None:
            out.append(f"{at} the front end's costs read x{r.frontend_scale:.2f} of the "
                       "low-load fit from the warm-up's median latency (the work shares the "
                       "CPUs with the client, the batcher and the model under load); "
                       "fixed_frontend holds the prediction with the fitted costs")
    return out


def repeat_notes(rows: list[RateCheck]) -> list[str]:
    """The rates whose run did not repeat its own warm-up: the warm-up, held to the run
    as a prediction, misses a tolerance (see warmup_as_prediction)."""
    out = []
    for r in rows:
        if r.warmup_measured is None:
            continue
        off = {k: c for k, c in warmup_as_prediction(r.measured, r.warmup_measured).items()
               if c.ok is False}
        if not off:
            continue
        figs = ", ".join(f"{k.removesuffix('_ms').replace('_', ' ')} {c.predicted:.3g} "
                         f"against the run's {c.measured:.3g} ({c.error:+.0%})"
                         for k, c in off.items() if c.error is not None)
        out.append(f"at {r.rate_per_s:g}/s the measurement did not repeat itself: the warm-up "
                   f"at this rate just before the run measured {figs}, beyond the "
                   "tolerance; a prediction made before the run cannot be judged there "
                   "more finely than that (warmup.as_prediction; --stability-percentage "
                   "or a quieter machine)")
    return out


def stability_notes(rows: list[RateCheck]) -> list[str]:
    """With --stability-percentage: how many windows each rate took, and the rates whose
    last three windows never agreed (their figures are one noisy stretch's)."""
    out = []
    for r in rows:
        st = r.measured.stability
        if st is None:
            continue
        spread = last_spread(st["window_latency_ms"])
        if st["stable"]:
            out.append(f"at {r.rate_per_s:g}/s the measurement settled after {st['windows']} "
                       f"windows: the last three agreed (latency within {spread:.0%}), and "
                       "the figures are theirs together")
        else:
            out.append(f"at {r.rate_per_s:g}/s the measurement did not settle in "
                       f"{st['windows']} windows (the last three's latency {spread:.0%} "
                       "apart): the figures are the last three together, a stretch of "
                       "a server or machine whose speed moved; a longer --duration or a "
                       "quieter machine may settle it")
    return out


def trace_notes(rows: list[RateCheck], trace: Path | None, given: bool) -> list[str]:
    """Where a trace was to be read (`given`: the user's --trace-file) and no warm-up's
    window was found in it."""
    if trace is None or not given:
        return []
    missed = [f"{r.rate_per_s:g}/s" for r in rows
              if r.warmup_measured is not None and r.handoff is None and r.stalls is None]
    if not missed:
        return []
    return [f"--trace-file = {cut(str(trace))}: no file {cut(trace.name, 60)}.N held a request "
            f"of the warm-up at {', '.join(missed)}, so nothing was read from the trace "
            "there; fix: start the server on this machine with --trace-config "
            "level=TIMESTAMPS, rate=1, triton,file=PATH and triton,log-frequency=500 (Triton "
            "writes PATH.N every 500 requests; the last part only when it stops), and give "
            "the same PATH"]


def stall_notes(r: RateCheck, at: str) -> list[str]:
    """What the warm-up's trace showed of the server's stalls, and what was simulated."""
    st = r.stalls
    if st is None:
        return []
    if not st.stalls:
        return [f"{at} the warm-up's trace showed no stall in {st.batches} batches (none "
                f"took {STALL_FACTOR:g}x its size's usual time and {STALL_MIN_MS:g} ms more)"]
    d = st.to_dict()["length_ms"]
    return [f"{at} the warm-up's trace showed {st.stalls} stall(s) in {st.batches} batches "
            f"(a batch {STALL_FACTOR:g}x its size's usual time or more): {st.per_s:.1f} a "
            f"second over {st.span_s:.1f} s, {d['p50']:.2f} ms at the median, "
            f"{d['max']:.2f} ms the longest, {st.share:.1%} of the batches' time; the "
            "prediction simulates them (the whole server paused; without_stalls holds the "
            "prediction without them)"]


def notes_for(rows: list[RateCheck], prof: Profile | None = None) -> list[str]:
    notes = [
        "service time is deterministic per batch size: a v2 server's statistics are sums, "
        "so a batch's spread cannot be told from the spread outside the server; all "
        "measured spread is in the outside time",
    ]
    if prof is None or not prof.frontend_workers:
        notes.append("the time outside the server (client, HTTP, parsing) is measured at low "
                     "load and does not grow with the rate in the simulator (--frontend-"
                     "workers makes the server's front end a station that queues)")
    else:
        notes.append(f"the server's front end is a station of {prof.frontend_workers} "
                     f"worker(s){' (an event loop)' if prof.frontend_event_loop else ''} at "
                     f"{prof.frontend_cpu_ms:.3f} ms a request"
                     + (f" and {prof.frontend_turn_ms:.3f} ms a turn"
                        if prof.frontend_turn_ms else "") + ", before the batcher"
                     + (f", and {prof.frontend_answer_ms:.3f} ms an answer in a turn of its "
                        "own when its batch ends (the answer's share of the cost a request "
                        "as measured in servelab's gateway, or --frontend-answer-share)"
                        if prof.frontend_answer_ms else "")
                     + "; the rest of the time outside (client, network) is measured at low "
                     "load and does not grow with the rate")
    if prof is not None:
        notes.extend(prof.notes)
        if (prof.host_cpu_steal or 0) > STEAL_NOTE:
            notes.append(f"while profiling, the hypervisor gave {prof.host_cpu_steal:.0%} of "
                         "this virtual machine's CPU time to others (steal): the profile "
                         "may read slow; measure on a machine of your own")
        if (c := prof.calibration) is not None:
            notes.append("the profile was calibrated under open-loop load (the saturation "
                         f"search's steps): batch sizes {', '.join(c.sizes_ms)} as the "
                         f"server ran them, the closed-loop profile x{c.profile_scale:.2f}"
                         " elsewhere; each rate's closed_loop_profile holds the uncalibrated "
                         "prediction")
    for r in rows:
        m, at = r.measured, f"at {r.rate_per_s:g}/s"
        notes += gap_note(m.wait_gaps, m.wait_gap_s, at)
        drift = r.probe_drift
        if abs(drift - 1.0) > 0.05:
            notes.append(f"{at} a one-row batch took {drift - 1:+.0%} "
                         "against its time at profiling (the probe just before the run): "
                         "the server's speed moved between profiling and measuring"
                         + ("; by this much the profile no longer describes the server: "
                            "measure on a quieter machine" if not 0.5 <= drift <= 2 else ""))
        g = r.given_measured_compute
        if g and abs(g.profile_scale - 1.0) > 0.05:
            gc = g.compare
            notes.append(f"{at} the server's batches took "
                         f"{g.profile_scale - 1:+.0%} against its profile; given the "
                         f"run's own batch times the simulator's mean batch is "
                         f"{_pct(gc['mean_batch'].error)}, p50 {_pct(gc['p50_ms'].error)}, "
                         f"mean queue {_pct(gc['queue_ms'].error)} off the measurement")
        sent = g.on_sent_times if g else None
        if (sent and g and sent["mean_batch"].error is not None
                and g.compare["mean_batch"].error is not None
                and abs(sent["mean_batch"].error - g.compare["mean_batch"].error) > 0.01):
            notes.append(f"{at} the client sent late (p99 "
                         f"{m.behind_p99_ms:.1f} ms): on the "
                         "times the requests left it, the diagnosis' mean batch is "
                         f"{sent['mean_batch'].error:+.1%} off the measurement, against "
                         f"{g.compare['mean_batch'].error:+.1%} on the intended times")
        rb = g.run_batches if g else None
        if rb and rb.error is not None and abs(rb.error) > 0.05:
            notes.append(f"{at} the diagnosis' times give the server's "
                         f"own batches {rb.error:+.0%} compute against its statistics: "
                         "the sizes it ran fewer than "
                         f"{MIN_RUN_BATCHES} times took longer or shorter than the line "
                         "through the others (stalls land in few batches)")
        if m.behind_p99_ms > 1.0:
            notes.append(f"{at} the load generator fell behind (p99 "
                         f"{m.behind_p99_ms:.1f} ms late): the client, not "
                         "only the server, shapes that row")
        steal = m.cpu.get("host_cpu_steal") or 0
        if steal > STEAL_NOTE:
            notes.append(f"{at} the hypervisor gave {steal:.0%} of this "
                         "virtual machine's CPU time to others (steal), stalling client and "
                         "server at random: measure on a machine of your own")
        busy = m.cpu.get("host_cpu_busy")
        if busy is not None and busy > HOST_BUSY_NOTE:
            notes.append(f"{at} this machine's CPUs were {busy:.0%} busy "
                         f"(the load generator used {m.cpu['client_cpu_cores']:.2f} "
                         "cores): client and server competed for them, which the simulator "
                         "does not model; measure from another machine to remove it")
        if m.errors:
            notes.append(f"{at} {m.errors} requests failed:"
                         f" {m.errors_by_reason}")
    return notes


def _pct(error: float | None) -> str:
    return "n/a" if error is None else f"{error:+.0%}"


def verdict(rows: list[RateCheck]) -> tuple[bool, list[str]]:
    misses = []
    for r in rows:
        for k, c in r.compare.items():
            if c.ok is False:
                misses.append(f"{r.rate_per_s:g}/s {k}: predicted {c.predicted:.3g}, "
                              f"measured {c.measured:.3g} ({c.error:+.0%}, tolerance "
                              f"±{c.tolerance:.0%})")
    return not misses, misses


FIGURES = (("mean_batch", "mean batch (requests)"), ("p50_ms", "p50 latency (ms)"),
           ("p99_ms", "p99 latency (ms)"), ("queue_ms", "mean server queue (ms)"))


def write_html(report: dict[str, Any], path: Any) -> None:
    """Predicted and measured curves against the rate, one chart per figure; plotly.js
    is written beside the page, so it opens offline."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = report["rates"]
    x = [r["rate_per_s"] for r in rows]
    fig = make_subplots(rows=2, cols=2, subplot_titles=[t for _, t in FIGURES])
    for i, (key, title) in enumerate(FIGURES):
        row, col = i // 2 + 1, i % 2 + 1
        for side, style in (("measured", {"mode": "lines+markers", "line": {"color": "#222"}}),
                            ("predicted", {"mode": "lines+markers",
                                           "line": {"color": "#1f77b4", "dash": "dash"}})):
            y = [r["compare"][key][side] for r in rows]
            fig.add_trace(go.Scatter(x=x, y=y, name=side, showlegend=i == 0,
                                     legendgroup=side, **style), row=row, col=col)
        fig.update_xaxes(title_text="offered rate (requests/s)", row=row, col=col)
        fig.update_yaxes(title_text=title, rangemode="tozero", row=row, col=col)
    verdict_text = "within tolerance" if report["within_tolerance"] else "outside tolerance"
    fig.update_layout(title=f"servelab validate: {report['model']} at {report['url']} "
                            f"({verdict_text})", height=760)
    fig.write_html(str(path), include_plotlyjs="directory", full_html=True)


# ---------------------------------------------------------------- the whole run, typed


@dataclass(frozen=True, slots=True)
class ValidationSpec:
    """What a `validate` run does; checked on construction, with each flag's name."""

    model: str | None = None
    url: str | None = None
    serve: str | None = None  # servelab's own gateway for the run: PATH.onnx or 'demo'
    rates: tuple[float, ...] | None = None  # None: 20/50/80% of the measured saturation
    duration_s: float = 10.0
    max_batch_size: int | None = None
    max_queue_delay_us: int | None = None
    instances: int | None = None
    # the share of completion races the batcher thread wins; None: read from the trace
    # where one is read (see measure/handoff.py), else 0
    batcher_first: float | None = None
    seed: int = 0
    calibrate: bool = False
    # a warm-up run at each rate calibrates its prediction; None: on, unless --calibrate
    calibrate_at_rate: bool | None = None
    server_cpus: tuple[int, ...] | None = None
    client_cpus: tuple[int, ...] | None = None
    frontend_workers: int | None = None  # None: 1 with --serve (servelab's gateway), else 0
    frontend_cpu_ms: float | None = None  # None: fitted (see frontend_fit)
    frontend_event_loop: bool | None = None  # None: with --serve (the gateway's asyncio loop)
    # The share of an event loop's cost a request that is its answer (see
    # split_answer); None: ANSWER_SHARE with an event loop
    frontend_answer_share: float | None = None
    # Read the server's stalls from its trace during each rate's warm-up and simulate
    # them (see measure/stall_fit.py); None: on with --serve and a warm-up at each rate
    stalls: bool | None = None
    # perf_analyzer's stable measurement (measure/stability.py): each rate's run in
    # windows of duration_s until the last three agree; None: one window
    stability: Stability = field(default_factory=Stability)
    # The front end's costs at each rate scaled to give the warm-up's median latency
    # (see frontend_scale); None: on with a warm-up at each rate
    frontend_at_rate: bool | None = None
    # With --url: the server's trace file (Triton's --trace-config triton,file=PATH, at
    # level TIMESTAMPS, on this machine), read during each rate's warm-up as the
    # gateway's is with --serve
    trace_file: Path | None = None
    # Read the hand-off between batches from the warm-up's trace and simulate it (see
    # measure/handoff.py); None: on wherever a trace is read
    handoff: bool | None = None
    # Draw the warm-up's batch times in their order, in runs (stall_fit.speed_series);
    # None: on wherever a trace is read
    series: bool | None = None

    def __post_init__(self) -> None:
        if self.trace_file is not None and self.serve is not None:
            raise invalid("--trace-file", str(self.trace_file), "--url (with --serve, "
                          "validate traces the gateway it starts itself)",
                          "leave --trace-file out")
        if self.trace_file is not None and not self.trace_file.parent.is_dir():
            raise invalid("--trace-file", str(self.trace_file), "a path in a folder that "
                          "exists (the server writes PATH.0, PATH.1, ... there)",
                          "give the PATH of the server's --trace-config triton,file=PATH")
        if self.trace_file is not None and not self.at_rate:
            raise invalid("--trace-file", str(self.trace_file), "a warm-up at each rate "
                          "(validate reads the trace during each rate's warm-up)",
                          "leave out --calibrate and --no-calibrate-at-rate, or leave "
                          "--trace-file out")
        for flag, on in (("--stalls", self.stalls), ("--handoff", self.handoff),
                         ("--series", self.series)):
            if on and not self.has_trace:
                raise invalid(flag, True, "a trace read during a warm-up at each rate: "
                              "--serve (the gateway validate starts), or --url with "
                              "--trace-file", "use --serve or --trace-file without "
                              f"--calibrate, or leave {flag} out")
        if self.frontend_answer_share is not None and not (
                0.0 <= self.frontend_answer_share <= 1.0):
            raise invalid("--frontend-answer-share", self.frontend_answer_share,
                          "0 to 1 (the share of a request's cost in the event loop spent on "
                          "its answer)", f"leave it out for {ANSWER_SHARE:g}")
        if self.frontend_workers is not None and not 0 <= self.frontend_workers <= (
                MAX_FRONTEND_WORKERS):
            raise invalid("--frontend-workers", self.frontend_workers,
                          f"0 to {MAX_FRONTEND_WORKERS} (0: no front-end station)",
                          "1 for an interpreter-bound server, Triton's --http-thread-count "
                          "(8 by default) for tritonserver")
        if self.frontend_event_loop and (self.frontend_workers or 1) != 1:
            raise invalid("--frontend-workers", self.frontend_workers, "1 with "
                          "--frontend-event-loop (an event loop is one thread)",
                          "leave --frontend-workers out, or give --no-frontend-event-loop")
        if self.frontend_cpu_ms is not None and not 0 <= self.frontend_cpu_ms <= 1000:
            raise invalid("--frontend-cpu-ms", self.frontend_cpu_ms,
                          "0 to 1000 ms a request", "leave it out to fit it")
        if (self.url is None) == (self.serve is None):
            raise invalid("--url/--serve", (self.url, self.serve), "exactly one of them",
                          "give --url http://127.0.0.1:8000 --model NAME, or --serve demo")
        if not 1 <= self.duration_s <= 600:
            raise invalid("--duration", self.duration_s, "1 to 600 seconds per rate", "e.g. 10")
        if self.batcher_first is not None and not 0 <= self.batcher_first <= 1:
            raise invalid("--batcher-first", self.batcher_first, "a share from 0 to 1",
                          "the share servelab replay-trace prints, or 0")
        if self.calibrate and self.calibrate_at_rate is True:
            raise invalid("--calibrate-at-rate", True, "one calibration: not with --calibrate",
                          "give --calibrate (the saturation search's steps) or "
                          "--calibrate-at-rate (a warm-up at each rate), not both")
        if self.server_cpus is not None and self.serve is None:
            raise invalid("--server-cpus", self.server_cpus, "--serve (validate starts that "
                          "server)", "pin a server you started yourself with taskset -c, or "
                          "use --serve")
        if self.server_cpus and self.client_cpus and set(self.server_cpus) & set(
                self.client_cpus):
            raise invalid("--client-cpus", self.client_cpus, "CPUs apart from --server-cpus "
                          f"{list(self.server_cpus)}", "give the load generator other CPUs")
        if self.name is None:
            raise invalid("--model", None, "the model's name on the server",
                          "e.g. --model resnet")

    @property
    def name(self) -> str | None:
        return self.model or ("demo" if self.serve else None)

    @property
    def at_rate(self) -> bool:
        """Whether each rate is predicted from a warm-up at that rate: by default, unless
        the profile is calibrated by the saturation search instead (--calibrate). On the
        2-core VM (2026-12-05) the warm-up's batch times matched the run's within 15%
        where the closed-loop profile's were 8-28% off, and against the test's Triton the
        whole prediction met issue 28's --url target in 4 of 7 runs with it, 1 of 7
        without (docs/load-and-validate.md)."""
        return (self.calibrate_at_rate if self.calibrate_at_rate is not None
                else not self.calibrate)

    @property
    def front_end_at_rate(self) -> bool:
        """Whether a front-end station's costs are read at each rate from its warm-up (see
        frontend_scale): by default where there is a warm-up."""
        return (self.frontend_at_rate if self.frontend_at_rate is not None
                else self.at_rate)

    @property
    def has_trace(self) -> bool:
        """Whether a server's trace can be read during each rate's warm-up: the gateway's
        that validate starts, or the one --trace-file names."""
        return self.at_rate and (self.serve is not None or self.trace_file is not None)

    @property
    def with_stalls(self) -> bool:
        """Whether the prediction simulates the stalls the warm-up's trace showed: by
        default wherever a trace is read."""
        return self.stalls if self.stalls is not None else self.has_trace

    @property
    def with_handoff(self) -> bool:
        """Whether the prediction simulates the hand-off between batches the warm-up's
        trace showed (measure/handoff.py): by default wherever a trace is read."""
        return self.handoff if self.handoff is not None else self.has_trace

    @property
    def with_series(self) -> bool:
        """Whether the prediction draws the warm-up's batch times in their order, in runs
        (stall_fit.speed_series): by default wherever a trace is read."""
        return self.series if self.series is not None else self.has_trace


@dataclass(frozen=True, slots=True)
class ValidationReport:
    """A whole `validate` run, each rate a RateCheck; `to_dict()` is the stable
    validation.json."""

    model: str
    url: str
    policy_source: str
    cpus: dict[str, list[int]]
    saturation_per_s: float | None
    closed_loop_per_s: float | None
    profile: Profile
    closed_loop_profile: Profile | None
    rates: tuple[RateCheck, ...]
    within_tolerance: bool
    misses: tuple[str, ...]
    notes: tuple[str, ...]
    fit: Scenario

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "url": self.url, "policy_source": self.policy_source,
            "cpus": dict(self.cpus), "saturation_per_s": self.saturation_per_s,
            "closed_loop_per_s": self.closed_loop_per_s, "profile": self.profile.to_dict(),
            **({"closed_loop_profile": self.closed_loop_profile.to_dict()}
               if self.closed_loop_profile is not None else {}),
            "rates": [r.to_dict() for r in self.rates], "tolerance": dict(TOLERANCE),
            "within_tolerance": self.within_tolerance, "misses": list(self.misses),
            "notes": list(self.notes),
            # the fitted scenario as the lab's page state (section.key), so the page can
            # draw the measurement over the scenario it was held against
            "fit_state": jsonable(flatten(scenario_to_dict(self.fit)))}


def run_validation(spec: ValidationSpec, *,
                   say: Callable[[str], None] = lambda s: None) -> ValidationReport:
    """Profile a v2 server (started here with `spec.serve`), fit, find its saturation,
    load it at each rate and predict on the same arrivals (see the module docstring)."""
    import contextlib
    import sys
    import tempfile
    from pathlib import Path

    from servelab.measure.load import metadata, parse_url
    from servelab.measure.process import free_port, pin_this_process, server_process

    name = spec.name
    assert name is not None  # checked by ValidationSpec
    pinned = {k: sorted(v) for k, v in (("server", spec.server_cpus),
                                         ("client", spec.client_cpus)) if v is not None}
    url = spec.url
    trace = spec.trace_file if spec.has_trace else None
    with contextlib.ExitStack() as stack:
        if spec.serve is not None:
            from servelab.gateway.demo import VALIDATION_MLP, write_mlp

            path = spec.serve
            if spec.serve == "demo":
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="servelab-val-"))
                path = str(write_mlp(Path(tmp) / "mlp.onnx", **VALIDATION_MLP))
            elif not Path(spec.serve).is_file():
                raise InputError(f"--serve = {spec.serve!r}: no such file; fix: a .onnx "
                                 "path, or --serve demo")
            port = free_port()
            cmd = [sys.executable, "-m", "servelab", "serve", "--model", f"{name}={path}",
                   "--port", str(port)]
            for flag, v in (("--max-batch-size", spec.max_batch_size),
                            ("--max-queue-delay-us", spec.max_queue_delay_us),
                            ("--instances", spec.instances)):
                if v is not None:
                    cmd += [flag, str(v)]
            if spec.with_stalls or spec.with_handoff or spec.with_series:
                trace = Path(stack.enter_context(tempfile.TemporaryDirectory(
                    prefix="servelab-trace-"))) / "trace"
                from servelab.trace_file import MAX_TRACE_REQUESTS

                cmd += ["--trace-file", str(trace),
                        "--trace-requests", str(MAX_TRACE_REQUESTS)]
            say(f"validate: starting servelab serve on port {port}...")
            stack.enter_context(server_process(
                cmd, f"http://127.0.0.1:{port}/v2/health/ready",
                cpus=frozenset(pinned["server"]) if "server" in pinned else None))
            url = f"http://127.0.0.1:{port}"
        assert url is not None
        target = parse_url(url, name)
        meta = metadata(target)
        if "client" in pinned:  # once the server answers: a refused run pins nothing
            pin_this_process(frozenset(pinned["client"]))
        sp = read_policy(target, {"max_batch_size": spec.max_batch_size,
                                  "max_queue_delay_us": spec.max_queue_delay_us,
                                  "instances": spec.instances})
        sp = replace(sp, policy=replace(sp.policy, batcher_first=spec.batcher_first or 0.0))
        p = sp.policy
        say(f"validate: {name} at {target.base}: max_batch_size {p.max_batch_size}, "
            f"max_queue_delay {p.max_queue_delay_microseconds} us, preferred "
            f"{list(p.preferred_batch_size) or 'none'}, {sp.instances} instance(s) "
            f"(from {sp.source})")
        closed_prof = profile_server(target, meta, sp, seed=spec.seed, say=say)
        closed_prof.frontend_workers = (spec.frontend_workers if spec.frontend_workers
                                        is not None else int(spec.serve is not None))
        if closed_prof.frontend_workers:
            closed_prof.frontend_event_loop = closed_prof.frontend_workers == 1 and (
                spec.frontend_event_loop if spec.frontend_event_loop is not None
                else spec.serve is not None)
            if spec.frontend_cpu_ms is not None:
                closed_prof.frontend_cpu_ms = spec.frontend_cpu_ms
            else:
                closed_prof.frontend_cpu_ms, closed_prof.frontend_turn_ms = frontend_fit(
                    closed_prof)
                closed_prof.notes.extend(frontend_fit_notes(closed_prof))
            if closed_prof.frontend_event_loop:
                split_answer(closed_prof, ANSWER_SHARE if spec.frontend_answer_share is None
                             else spec.frontend_answer_share)
            say(f"validate: front end {closed_prof.frontend_workers} worker(s)"
                f"{' (an event loop)' if closed_prof.frontend_event_loop else ''}, "
                f"{closed_prof.frontend_cpu_ms:.3f} ms a request"
                + (f", {closed_prof.frontend_answer_ms:.3f} ms an answer"
                   if closed_prof.frontend_answer_ms else "")
                + (f", {closed_prof.frontend_turn_ms:.3f} ms a turn"
                   if closed_prof.frontend_turn_ms else ""))
        sat = closed = None
        calibration: dict[int, tuple[int, int]] = {}
        grid = list(spec.rates) if spec.rates is not None else None
        if grid is None or spec.calibrate:
            sat, closed, calibration = saturation(
                target, meta, sp, float(np.median(closed_prof.low_load_ms)), seed=spec.seed,
                say=say)
            say(f"validate: open-loop saturation about {sat:.0f} requests/s")
        if grid is None:
            assert sat is not None
            grid = [round(sat * f, -1) or round(sat * f, 1) for f in (0.2, 0.5, 0.8)]
        prof = under_load(closed_prof, calibration) if spec.calibrate else closed_prof
        if prof.calibration is not None:
            c = prof.calibration
            say(f"validate: profile calibrated under open-loop load: batch sizes "
                f"{', '.join(c.sizes_ms)} as measured, the closed-loop profile "
                f"x{c.profile_scale:.3f} elsewhere")
        fit = fit_scenario(target, sp, prof)
        rows = []
        for k, rate in enumerate(grid):
            n = max(200, min(int(rate * spec.duration_s), 2_000_000))
            say(f"validate: {rate:g}/s, {n:,} requests...")
            rows.append(measure_and_predict(
                target, meta, sp, prof, rate, n, spec.seed + k,
                closed_loop=closed_prof if prof is not closed_prof else None,
                at_rate=spec.at_rate, trace=trace, stability=spec.stability,
                frontend_at_rate=spec.front_end_at_rate, stalls_on=spec.with_stalls,
                handoff=spec.with_handoff, race=spec.batcher_first is None,
                series=spec.with_series))
    ok, misses = verdict(rows)
    return ValidationReport(
        model=name, url=target.base, policy_source=sp.source, cpus=pinned,
        saturation_per_s=sat, closed_loop_per_s=closed, profile=prof,
        closed_loop_profile=closed_prof if prof is not closed_prof else None,
        rates=tuple(rows), within_tolerance=ok, misses=tuple(misses),
        notes=tuple(notes_for(rows, prof) + saturation_notes(sat, closed)
                    + warmup_notes(rows, spec.at_rate) + repeat_notes(rows)
                    + trace_notes(rows, trace, spec.trace_file is not None)
                    + stability_notes(rows)), fit=fit)
