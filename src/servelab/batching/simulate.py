"""Run a scenario's batcher: inputs drawn from one seed, one flat record per request."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import wait
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
from numba import njit

from servelab.aside import aside
from servelab.batching.answering import answering_run
from servelab.batching.arrivals import arrival_draw
from servelab.batching.engine import (
    MORE_ROOM,
    REJECTED,
    S_NB,
    SERVED,
    TIMED_OUT,
    check_multipliers,
    more_room,
    new_records,
    new_state,
)
from servelab.batching.service import (
    ServiceModel,
    build_service_model,
    draw_multipliers,
    exec_table_ns,
)
from servelab.batching.stalls import Stalls, check_count
from servelab.batching.triton_engine import run_batcher_triton
from servelab.errors import InputError
from servelab.scenario import BatchingPolicy, Latency, Scenario, Variability


@dataclass(frozen=True, slots=True, eq=False)
class Records:
    """What happened to every request and every batch, as parallel arrays.

    Requests: ``status`` is SERVED, REJECTED or TIMED_OUT for every arrival, so
    ``arrivals == served + rejected + timed_out`` by construction; ``batch`` is the
    served request's batch (-1 otherwise). A request's start and end are its batch's,
    so they are not stored per request (5 bytes a request instead of 21): ``start_ns``
    and ``end_ns`` build them when asked.
    """

    arrival_ns: np.ndarray
    status: np.ndarray
    batch: np.ndarray
    batch_size: np.ndarray
    batch_start_ns: np.ndarray
    batch_end_ns: np.ndarray
    batch_instance: np.ndarray
    num_instances: int
    timeout_ns: int = 0

    @property
    def start_ns(self) -> np.ndarray:
        """Each request's batch start (-1 unless served)."""
        out = np.full(self.status.size, -1, np.int64)
        served = self.batch >= 0
        out[served] = self.batch_start_ns[self.batch[served]]
        return out

    @property
    def end_ns(self) -> np.ndarray:
        """Each request's end: its batch's completion when served, its arrival when
        rejected, its deadline (arrival + timeout) when timed out."""
        out = self.arrival_ns.copy()
        served = self.batch >= 0
        out[served] = self.batch_end_ns[self.batch[served]]
        out[self.status == TIMED_OUT] += self.timeout_ns
        return out

    def last_end_ns(self) -> int:
        """The last instant of the run: the last arrival, completion or deadline."""
        last = max(int(self.arrival_ns.max(initial=0)), int(self.batch_end_ns.max(initial=0)))
        if self.timeout_ns:
            timed_out = self.arrival_ns[self.status == TIMED_OUT]
            if timed_out.size:
                last = max(last, int(timed_out.max()) + self.timeout_ns)
        return last

    def served_ns(self, part: str) -> np.ndarray:
        """Per served request, in arrival order, a new int64 array of nanoseconds:
        "queue" (batch start - arrival), "gpu" (batch end - start) or "end_to_end"
        (batch end - arrival), gathered from the batch arrays."""
        served = None if self.batch.size == 0 or int(self.batch.min()) >= 0 else (
            self.batch >= 0)  # None: every request was served, no mask needed
        b = self.batch if served is None else self.batch[served]
        if part == "gpu":
            gpu: np.ndarray = (self.batch_end_ns - self.batch_start_ns)[b]
            return gpu
        out: np.ndarray = (self.batch_start_ns if part == "queue" else self.batch_end_ns)[b]
        out -= self.arrival_ns if served is None else self.arrival_ns[served]
        return out

    def batch_gpu_ns(self) -> tuple[np.ndarray, np.ndarray]:
        """Each batch's GPU time and its size: the per-request GPU times are these, each
        counted size times (a fifth as many values at a batch of five)."""
        return self.batch_end_ns - self.batch_start_ns, self.batch_size

    @property
    def served(self) -> np.ndarray:
        mask: np.ndarray = self.status == SERVED
        return mask

    def count(self, status: int) -> int:
        return int(np.count_nonzero(self.status == status))

    @property
    def counts(self) -> dict[str, int]:
        n = int(self.status.size)
        served = self.count(SERVED)
        rejected = self.count(REJECTED) if served < n else 0  # all served: no more passes
        return {"arrivals": n, "served": served, "rejected": rejected,
                "timed_out": self.count(TIMED_OUT) if served + rejected < n else 0}

    def batch_totals(self) -> tuple[int, int, int, np.ndarray]:
        """Over the batches, in one pass: the rows they ran, the instance time they took
        (ns), the last one's end (0 with none), and how many there were of each size."""
        return _batch_totals(self.batch_size, self.batch_start_ns, self.batch_end_ns)


@njit(cache=True, nogil=True)
def _batch_totals(size: np.ndarray, start: np.ndarray, end: np.ndarray
                  ) -> tuple[int, int, int, np.ndarray]:
    rows = 0
    busy = 0
    last = 0
    for b in range(size.size):
        rows += size[b]
        busy += end[b] - start[b]
        last = max(last, end[b])
    hist = np.zeros((size.max() if size.size else 0) + 1, np.int64)
    for b in range(size.size):
        hist[size[b]] += 1
    return rows, busy, last, hist


def simulate_policy(
    arrival_ns: np.ndarray,
    exec_ns: np.ndarray,
    multiplier: np.ndarray,
    policy: BatchingPolicy,
    num_instances: int,
    seed: int = 0,
    *,
    draw: Callable[[int], None] | None = None,
) -> Records:
    """The batcher alone, on given arrivals and service draws (`simulate`'s core; tests
    and the bench call it directly); `seed` draws who wins each completion race when
    ``policy.batcher_first`` is between 0 and 1, and which wake-ups are lost with
    ``policy.lost_wakeup``.

    With `draw`, ``arrival_ns`` is filled as the run goes: ``draw(k)`` fills it up to k
    (see arrivals.ArrivalDraw). The engine runs on this thread over one part while the
    next part is drawn on a second (the draw releases the GIL, and so does the engine).
    """
    preferred = np.zeros(policy.max_batch_size + 1, dtype=np.bool_)
    preferred[list(policy.effective_preferred)] = True
    check_multipliers(multiplier, arrival_ns.size)
    n = arrival_ns.size
    if n >= 2**31:
        raise ValueError(f"{n:,} requests: the engines number requests in int32, so at most "
                         f"{2**31 - 1:,} a run")
    if draw is None:
        arrival_ns = np.ascontiguousarray(arrival_ns, dtype=np.int64)
    elif arrival_ns.dtype != np.int64 or not arrival_ns.flags.c_contiguous:
        raise ValueError("arrivals drawn as the run goes: a contiguous int64 array")
    parts = _parts(n) if draw is not None else [n]
    pipelined = len(parts) > 1
    if pipelined:  # drawn in order on a second thread
        assert draw is not None
        ready = [threading.Event() for _ in parts]
        failed = threading.Event()
        drawing = aside(partial(_draw_parts, draw, parts, ready, failed))
    elif draw is not None:
        draw(n)
    try:
        # Room for a batch per 4 requests first (any batching fits), not one per request:
        # the per-batch records are 24 bytes each. A run of smaller batches gets more.
        records = new_records(n, n // 4 + 16)
        state = new_state(num_instances)
        args = (arrival_ns, np.ascontiguousarray(exec_ns, dtype=np.float64),
                np.ascontiguousarray(multiplier, dtype=np.float64), preferred,
                policy.max_batch_size, policy.max_queue_delay_microseconds * 1000,
                num_instances, policy.max_queue_size,
                policy.default_timeout_microseconds * 1000)
        for i, limit in enumerate(parts):
            if pipelined:
                ready[i].wait()
                if failed.is_set():
                    drawing.result()  # raises the draw's error
            while True:
                code = run_batcher_triton(*args, records, state, limit,
                                          float(policy.batcher_first), seed % 2**32,
                                          float(policy.lost_wakeup))
                if code != MORE_ROOM:
                    break
                records = more_room(records, int(state[0][S_NB]))
    finally:
        if pipelined:
            wait([drawing])  # the arrays are not left to a thread still drawing into them
    nb = int(state[0][S_NB])
    status, batch, b_size, b_start, b_end, b_inst, _ = records
    return Records(arrival_ns, status, batch, b_size[:nb], b_start[:nb], b_end[:nb],
                   b_inst[:nb], num_instances, policy.default_timeout_microseconds * 1000)


# A run's arrivals are drawn in parts, the engine on each part while the next is drawn:
# a first part of this many, then each twice the last up to PART. (A part of PART runs in
# about 1 ms, and handing a part over between threads costs some microseconds.)
FIRST_PART = 1 << 14
PART = 1 << 16


def _parts(n: int) -> list[int]:
    """How many arrivals the engine may know at each of its calls: the parts' ends."""
    ends = [min(n, FIRST_PART)]
    while ends[-1] < n:
        ends.append(min(n, ends[-1] + min(ends[-1], PART)))
    return ends


def _draw_parts(draw: Callable[[int], None], parts: list[int],
                ready: list[threading.Event], failed: threading.Event) -> None:
    """Draw each part in order and say so; on an error, say that first, then wake every
    waiter to see it."""
    try:
        for end, done in zip(parts, ready, strict=True):
            draw(end)
            done.set()
    except BaseException:
        failed.set()
        for done in ready:
            done.set()
        raise


@dataclass(frozen=True, slots=True, eq=False)
class Simulation:
    """A scenario's run: records plus the per-request latency outside the GPU. With a
    front-end station, the records' arrivals are the batcher's (each request's arrival
    plus its time in the front end, `frontend_s`)."""

    scenario: Scenario
    service: ServiceModel
    records: Records
    fetch_s: np.ndarray  # per request; empty when the component is a constant (its median)
    network_s: np.ndarray
    frontend_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # empty: no station
    # The front end's arrivals (the requests' own, before the station); empty: no station
    sent_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


@njit(cache=True, nogil=True)
def frontend_pass(arrival_ns: np.ndarray, out_ns: np.ndarray, lo: int, hi: int, known: int,
                  total: int, workers: int, cost_ns: int, event_loop: bool,
                  turn_ns: int = 0) -> int:
    """Requests lo..hi-1 (and perhaps a few more) through the front end, each taking
    `cost_ns` of a worker: `out_ns` gets the instant each leaves it. `known` arrivals are
    drawn of `total`. Returns the first request not yet through: `hi` or more, or less
    when an event loop's turn could take requests not drawn yet (draw more, call again).

    Threads (first come, first served): with one cost for every request, the worker
    that frees first is always the one that took the request `workers` places earlier,
    so a request starts at its arrival or at that request's departure, whichever is
    later (Kiefer-Wolfowitz's recursion reduced to Lindley's per worker), and departures
    keep the arrivals' order.

    An event loop (one worker): a turn starts at the first waiting request's arrival or
    at the last turn's end, whichever is later, takes every request that has arrived by
    then, handles them one after another, and hands them on together at its end (the
    loop releases the interpreter to the batcher only between turns). A turn of k
    requests takes `turn_ns` + k x `cost_ns`.

    Earlier departures are read from `out_ns`, so the front end runs a part of the
    arrivals at a time.
    """
    if not event_loop:
        for i in range(lo, hi):
            start = arrival_ns[i]
            if i >= workers and out_ns[i - workers] > start:
                start = out_ns[i - workers]
            out_ns[i] = start + cost_ns
        return hi
    i = lo
    free = out_ns[lo - 1] if lo > 0 else 0
    while i < hi:
        start = max(arrival_ns[i], free)
        j = i + 1
        while j < known and arrival_ns[j] <= start:
            j += 1
        if j == known and known < total:
            return i  # the turn may take arrivals not drawn yet
        free = start + turn_ns + (j - i) * cost_ns
        for k in range(i, j):
            out_ns[k] = free
        i = j
    return i


def _component(lat: Latency, part: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Seconds per request: constant at the median, log-normal through (median, p99),
    or the measured samples resampled with replacement."""
    samples = getattr(lat, f"{part}_samples_ms")
    if samples:
        drawn: np.ndarray = rng.choice(np.asarray(samples, dtype=np.float64) / 1e3, n)
        return drawn
    median_ms, p99_ms = getattr(lat, f"{part}_ms"), getattr(lat, f"{part}_p99_ms")
    if p99_ms is None or lat.is_constant(part):
        return np.zeros(0)  # a constant: the Report adds the median, no array per request
    sigma = np.log(p99_ms / median_ms) / 2.3263478740408408  # z(0.99)
    return rng.lognormal(np.log(median_ms / 1e3), sigma, n)


# Simulated time is int64 ns; the engine's "never" is 2**62. Keep every instant below this.
MAX_TIME_NS = 1 << 61


def check_time_range(last_ns: int, count: int, slowest_ns: float, policy: BatchingPolicy,
                     num_requests: int) -> None:
    """Refuse a run whose clock could pass what int64 nanoseconds hold.

    The latest any instant can be, while the engine knows `count` arrivals (the last at
    `last_ns`): the last arrival, plus every request run as its own batch one after
    another at the slowest draw, plus the batch window and the timeout.
    """
    worst = float(last_ns) + count * slowest_ns + policy.max_queue_delay_microseconds * 1e3 + (
        policy.default_timeout_microseconds * 1e3)
    if not worst < MAX_TIME_NS:
        raise InputError(
            f"[workload] num_requests = {num_requests:,}: the run could reach "
            f"{worst / 1e9:.3g} s of simulated time; expected at most "
            f"{MAX_TIME_NS / 1e9:.3g} s (int64 nanoseconds); "
            "fix: fewer requests, a faster [model], or a higher qps")


def simulate(scenario: Scenario, service: ServiceModel | None = None) -> Simulation:
    """Simulate a scenario. Same scenario (seed included), same result, bit for bit.

    `service` is the scenario's service-time model when the caller already built it
    (it depends on the GPU type, not the count: the planner reuses one across counts).
    """
    s = scenario
    policy = s.batching
    if service is None:
        service = build_service_model(s.model, s.hardware.spec(), policy.max_batch_size,
                                      s.resolve_path)
    # Independent streams per purpose, so changing one part of the scenario does
    # not reshuffle the draws of another (common random numbers across a sweep).
    # (spawn(5)'s first four are spawn(4)'s: a scenario without stalls draws as before)
    arr_rng, svc_rng, fetch_rng, net_rng, stall_rng = (
        np.random.default_rng(seq) for seq in np.random.SeedSequence(s.workload.seed).spawn(5)
    )
    arrivals = arrival_draw(s.workload, arr_rng, s.resolve_path)
    n = arrivals.size
    lat = s.latency
    stalls, real_ns = None, arrivals.ns
    if lat.stalls:  # the server runs on its own clock (see stalls.py): arrivals go in
        arrivals.draw(n)
        check_count(lat.stalls_per_s, float(arrivals.ns[-1]), "[latency] stalls_per_s")
        stalls = Stalls(lat.stalls_per_s, lat.stall_lengths_ms, stall_rng)
        real_ns = arrivals.ns.copy()
        arrivals.ns[:] = stalls.to_server(real_ns)
    mult = (np.ones(1) if s.model.variability is Variability.DETERMINISTIC else
            draw_multipliers(s.model.variability, s.model.cv, n, svc_rng, s.model.multipliers,
                             s.model.multiplier_block))
    exec_ns = exec_table_ns(service, policy.max_batch_size)
    slowest_ns = float(exec_ns.max()) * float(mult.max(initial=1.0))
    # With a front-end station the batcher sees each request when it leaves the station.
    station = lat.frontend
    cost_ns = round(lat.frontend_cpu_ms * 1e6) if station else 0
    turn_ns = round(lat.frontend_turn_ms * 1e6) if station else 0
    answer_ns = round(lat.frontend_answer_ms * 1e6) if station else 0
    at_batcher = np.empty(n, np.int64) if station else arrivals.ns
    passed = [0]  # requests through the front end (all checked) so far

    def draw(upto: int) -> None:  # each part checked before the engine runs on it
        arrivals.draw(upto)
        upto = min(upto, n)
        while passed[0] < upto:
            # every arrival known so far; a front end adds at most its cost to each
            known = arrivals.drawn if station else upto
            check_time_range(int(arrivals.ns[known - 1]), known,
                             slowest_ns + cost_ns + turn_ns + answer_ns, policy, n)
            passed[0] = upto if not station else frontend_pass(
                arrivals.ns, at_batcher, passed[0], upto, known, n, lat.frontend_workers,
                cost_ns, lat.frontend_event_loop, turn_ns)
            if passed[0] < upto:  # an event loop's turn reaches past the arrivals drawn
                arrivals.draw(known + max(known, 1024))

    instances = s.hardware.num_gpus * policy.instances_per_gpu
    if answer_ns:  # the loop's answers and the batcher run as one (see answering.py)
        draw(n)
        records, frontend_s = _answered(arrivals.ns, exec_ns, mult, policy, instances,
                                        cost_ns, turn_ns, answer_ns, s.workload.seed,
                                        stalls, real_ns)
    else:
        records = simulate_policy(at_batcher, exec_ns, mult, policy, instances,
                                  seed=s.workload.seed, draw=draw)
        if stalls is not None:  # ... and every instant the server made comes back out
            records = _to_real(records, stalls, real_ns, station)
        frontend_s = (records.arrival_ns - real_ns) / 1e9 if station else np.zeros(0)
    return Simulation(
        scenario=s,
        service=service,
        records=records,
        fetch_s=_component(lat, "feature_fetch", n, fetch_rng),
        network_s=_component(lat, "network", n, net_rng),
        frontend_s=frontend_s,
        sent_ns=real_ns if station else np.zeros(0, np.int64),
    )


def _to_real(records: Records, stalls: Stalls, real_ns: np.ndarray, station: bool
             ) -> Records:
    """Records made on the server's clock, in real time. A request's own arrival stays
    its real one where it went straight to the batcher (a stall it came in keeps it
    waiting: the wait is its queue); behind a front end it reaches the batcher when the
    front end hands it on."""
    last = records.last_end_ns()
    real_last = int(stalls.to_real(np.array([last]))[0])
    if not real_last < MAX_TIME_NS:
        raise InputError(
            f"[latency] stalls_per_s = {stalls.per_s:g}: with its stalls the run reaches "
            f"{real_last / 1e9:.3g} s; expected at most {MAX_TIME_NS / 1e9:.3g} s; fix: "
            "shorter or fewer stalls, or fewer requests")
    return replace(records,
                   arrival_ns=stalls.to_real(records.arrival_ns) if station else real_ns,
                   batch_start_ns=stalls.to_real(records.batch_start_ns),
                   batch_end_ns=stalls.to_real(records.batch_end_ns))


def _answered(sent_ns: np.ndarray, exec_ns: np.ndarray, multiplier: np.ndarray,
              policy: BatchingPolicy, num_instances: int, cost_ns: int, turn_ns: int,
              answer_ns: int, seed: int, stalls: Stalls | None = None,
              real_ns: np.ndarray | None = None) -> tuple[Records, np.ndarray]:
    """The batcher behind an event loop that also writes the answers: its records and
    each request's seconds in the loop (before the batcher, and from its batch's end to
    its answer written; only the first for a request not served). With `stalls`,
    `sent_ns` is on the server's clock and `real_ns` the real sends."""
    (status, batch, b_size, b_start, b_end, b_inst), at_ns, answered = answering_run(
        sent_ns, cost_ns, turn_ns, answer_ns, exec_ns, multiplier, policy, num_instances,
        seed)
    records = Records(at_ns, status, batch, b_size, b_start, b_end, b_inst, num_instances,
                      policy.default_timeout_microseconds * 1000)
    if stalls is not None:
        assert real_ns is not None
        records = _to_real(records, stalls, real_ns, True)
        b_end, at_ns, sent_ns = records.batch_end_ns, records.arrival_ns, real_ns
        answered = stalls.to_real(answered)
    served = batch >= 0
    after = np.zeros(sent_ns.size, np.int64)
    after[served] = answered[served] - b_end[batch[served]]
    return records, (at_ns - sent_ns + after) / 1e9
