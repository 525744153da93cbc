"""How much slower this host runs Python than the 2-core VM the suite's time bars were
set on, so a bar of the issues' ("within 100 ms") is judged at that machine's speed.

These VMs' speed varies from day to day by 2x and more (docs/performance.md): on
2026-11-30 and 2026-12-01 the SimPy model of the seed scenario (tests/reference) ran at
168-170k requests/s on the 2-core VM where the lab's bars held with room to spare; on a
slow day it ran at 61-97k, and the same page was that much slower from end to end (its
server simulates in Python and Numba, Chromium renders on the same two cores). A bar is
the base figure times max(1, REFERENCE / this host's rate): the same bar on a machine as
fast as the reference, a proportionally wider one on a slower one, never a narrower
one. Each test prints the factor it used."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

REFERENCE_SIMPY_SEED_PER_S = 170_000  # the 2-core VM, 2026-11-30 and 2026-12-01
CALIBRATION_REQUESTS = 50_000
SLOWNESS_CAP = 4.0  # beyond this the host is not one the bars can speak for


@functools.cache
def host_slowness() -> float:
    """This host's slowness as first measured in this process (see `measure_slowness`)."""
    return measure_slowness()


def measure_slowness() -> float:
    """REFERENCE_SIMPY_SEED_PER_S over this host's best of three SimPy runs of the seed
    (50,000 requests, after a warm-up), at least 1, at most SLOWNESS_CAP."""
    import numpy as np

    from servelab.batching.service import build_service_model, exec_table_ns
    from servelab.scenario import load_scenario
    from tests.reference.simpy_triton import simulate_simpy_triton

    s = load_scenario("seed")
    svc = build_service_model(s.model, s.hardware.spec(), s.batching.max_batch_size)
    rng = np.random.default_rng(7)
    n = CALIBRATION_REQUESTS
    arrivals = np.rint(np.cumsum(rng.exponential(1 / s.workload.qps, n)) * 1e9).astype(np.int64)
    mult = rng.gamma(25.0, 1 / 25.0, n)
    table = exec_table_ns(svc, s.batching.max_batch_size)
    pol = s.batching
    c = s.hardware.num_gpus * pol.instances_per_gpu

    def one(k: int) -> float:
        t0 = time.perf_counter()
        simulate_simpy_triton(arrivals[:k], table, mult[:k], set(pol.preferred_batch_size),
                              pol.max_batch_size, pol.max_queue_delay_microseconds * 1000, c,
                              pol.max_queue_size, pol.default_timeout_microseconds * 1000)
        return time.perf_counter() - t0

    one(n // 5)  # warm-up
    rate = n / min(one(n) for _ in range(3))
    return min(SLOWNESS_CAP, max(1.0, REFERENCE_SIMPY_SEED_PER_S / rate))


def current_slowness() -> float:
    """The factor a time bar is judged at now: a VM's speed changes within a run (a suite
    here saw 1.8x and 3.0x an hour apart), so the larger of the one measured at the
    process's start and one measured now, right after the timed moves."""
    return max(host_slowness(), measure_slowness())


TRIES = 3


def holds_within(measure: Callable[[], dict[str, tuple[float, float]]], tries: int = TRIES
                 ) -> None:
    """Runs `measure` up to `tries` times and passes at the first run whose every figure
    is under its bar; fails, naming each try's figures, when every try missed.

    `measure` returns {label: (figure_ms, base_ms)} and asserts its own functional checks
    (those fail at once). The bar is base_ms at the host's speed right after the run
    (`current_slowness`). Why tries: a VM here has been 1.8x and 3.0x slower than the
    reference an hour apart, and a moment's stall lands in one p95 of 25 moves; a
    regression misses on every try, a busy moment on one."""
    seen = []
    for k in range(tries):
        figures = measure()
        factor = current_slowness()
        misses = {label: (round(v, 1), round(base * factor, 1))
                  for label, (v, base) in figures.items() if not v < base * factor}
        print(f"try {k + 1}: " + ", ".join(f"{label} {v:.0f} ms (bar {base * factor:.0f})"
                                           for label, (v, base) in figures.items())
              + f"; host {factor:.2f}x")
        if not misses:
            return
        seen.append(misses)
    raise AssertionError(f"every one of {tries} tries missed a bar (figure, bar): {seen}")
