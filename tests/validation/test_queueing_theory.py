"""The simulator held to queueing theory, within confidence intervals from independent
replications (seeds 1..R), not pinned seeded values.

The formulas are written out here, by hand, not taken from servelab.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from servelab.batching.engine import REJECTED, SERVED, TIMED_OUT
from servelab.batching.simulate import simulate
from servelab.scenario import scenario_from_dict

REPLICATIONS = 20
N = 200_000
WARMUP = 10_000  # requests dropped from the start of each replication (empty-system bias)


def scenario(qps: float, model: dict, instances: int = 1, **batching: object):
    return scenario_from_dict({
        "workload": {"qps": qps, "num_requests": N},
        "batching": {"max_batch_size": 1, "instances_per_gpu": instances, **batching},
        "model": model,
    })


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile, by bisection on its CDF (Simpson's rule over the density;
    written out so that the suite needs no SciPy, whose import numba's start-up would pay
    in every process)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(t: float, steps: int = 2000) -> float:
        h = t / steps
        f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 100.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def test_t_quantile_matches_published_table_values():
    # t tables (e.g. NIST/SEMATECH e-Handbook, 1.3.6.7.2): df 19 at 0.995: 2.861;
    # df 1 at 0.975: 12.706; df 10 at 0.95: 1.812.
    assert t_quantile(0.995, 19) == pytest.approx(2.861, abs=5e-4)
    assert t_quantile(0.975, 1) == pytest.approx(12.706, abs=5e-4)
    assert t_quantile(0.95, 10) == pytest.approx(1.812, abs=5e-4)


def replicate(s, statistic) -> tuple[float, float]:
    """Mean over replications and the 99% confidence half-width."""
    from dataclasses import replace

    vals = [statistic(simulate(replace(s, workload=replace(s.workload, seed=k))))
            for k in range(1, REPLICATIONS + 1)]
    half = t_quantile(0.995, REPLICATIONS - 1) * np.std(vals, ddof=1) / math.sqrt(REPLICATIONS)
    return float(np.mean(vals)), float(half)


def mean_wait_s(sim) -> float:
    r = sim.records
    keep = slice(WARMUP, None)
    assert (r.status == SERVED).all()
    return float(((r.start_ns - r.arrival_ns)[keep]).mean() / 1e9)


def check(theory: float, mean: float, half: float) -> None:
    # The interval must be narrow enough to catch a 3% error, and must hold the theory.
    assert half < 0.03 * theory, f"CI too wide to test anything: +/-{half:.3g}"
    assert abs(mean - theory) <= half, f"theory {theory:.6g}, simulated {mean:.6g} +/- {half:.3g}"


def test_md1_mean_wait_pollaczek_khinchine():
    lam, service_s = 700.0, 1e-3
    rho = lam * service_s
    theory = rho * service_s / (2 * (1 - rho))  # P-K with zero service variance
    s = scenario(lam, {"kind": "constant", "latency_ms": 1.0})
    check(theory, *replicate(s, mean_wait_s))


def test_front_end_md1_mean_time_pollaczek_khinchine():
    # One front-end worker of 1 ms before a near-instant model: an M/D/1 station.
    lam, service_s = 700.0, 1e-3
    rho = lam * service_s
    theory = service_s + rho * service_s / (2 * (1 - rho))
    s = scenario_from_dict({
        "workload": {"qps": lam, "num_requests": N},
        "batching": {"max_batch_size": 1},
        "model": {"kind": "constant", "latency_ms": 0.001},
        "latency": {"frontend_workers": 1, "frontend_cpu_ms": 1.0}})
    check(theory, *replicate(s, lambda sim: float(sim.frontend_s[WARMUP:].mean())))


def test_mm1_mean_wait():
    lam, mu = 700.0, 1000.0
    theory = (lam / mu) / (mu - lam)  # P-K with exponential service: rho / (mu - lambda)
    s = scenario(lam, {"kind": "constant", "latency_ms": 1.0, "variability": "exponential"})
    check(theory, *replicate(s, mean_wait_s))


def erlang_c(c: int, a: float) -> float:
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


@pytest.mark.parametrize(("c", "lam"), [(4, 3000.0), (3, 2400.0)])
def test_mmc_mean_wait_erlang_c(c, lam):
    mu = 1000.0
    theory = erlang_c(c, lam / mu) / (c * mu - lam)
    s = scenario(lam, {"kind": "constant", "latency_ms": 1.0, "variability": "exponential"},
                 instances=c)
    check(theory, *replicate(s, mean_wait_s))


def test_poisson_window_batch_is_one_plus_poisson():
    # An idle GPU and a near-instant model: a batch is its opener plus the Poisson(lambda W)
    # arrivals within the window, so the mean batch is 1 + lambda W (not lambda W).
    lam, w_us = 2000.0, 2000
    s = scenario(lam, {"kind": "constant", "latency_ms": 0.001}, max_batch_size=64,
                 max_queue_delay_microseconds=w_us)
    mean, half = replicate(s, lambda sim: float(sim.records.batch_size.mean()))
    check(1 + lam * w_us / 1e6, mean, half)
    var, vhalf = replicate(s, lambda sim: float(sim.records.batch_size.var()))
    check(lam * w_us / 1e6, var, vhalf)


def test_littles_law_with_batching():
    # L = lambda W, with L measured independently: the queue length sampled on a time grid.
    s = scenario(4000.0, {"kind": "affine", "base_ms": 0.8, "per_row_ms": 0.05},
                 max_batch_size=8, max_queue_delay_microseconds=500)
    r = simulate(s).records
    assert (r.status == SERVED).all()
    arr, start, end = r.arrival_ns, np.sort(r.start_ns), np.sort(r.end_ns)
    grid = np.linspace(arr[WARMUP], arr[-WARMUP], 200_000)
    in_queue = np.searchsorted(arr, grid, "right") - np.searchsorted(start, grid, "right")
    in_system = np.searchsorted(arr, grid, "right") - np.searchsorted(end, grid, "right")
    window = (r.arrival_ns >= grid[0]) & (r.arrival_ns <= grid[-1])
    lam_hat = window.sum() / ((grid[-1] - grid[0]) / 1e9)
    wq = ((r.start_ns - r.arrival_ns)[window]).mean() / 1e9
    w = ((r.end_ns - r.arrival_ns)[window]).mean() / 1e9
    assert in_queue.mean() == pytest.approx(lam_hat * wq, rel=0.02)
    assert in_system.mean() == pytest.approx(lam_hat * w, rel=0.02)


def replicate_each(s, statistics) -> list[tuple[float, float]]:
    """`replicate` for several statistics of the same runs."""
    from dataclasses import replace

    runs = [simulate(replace(s, workload=replace(s.workload, seed=k)))
            for k in range(1, REPLICATIONS + 1)]
    out = []
    for statistic in statistics:
        vals = [statistic(sim) for sim in runs]
        half = t_quantile(0.995, REPLICATIONS - 1) * np.std(vals, ddof=1) / math.sqrt(
            REPLICATIONS)
        out.append((float(np.mean(vals)), float(half)))
    return out


def share(status: int):  # type: ignore[no-untyped-def]
    return lambda sim: float((sim.records.status[WARMUP:] == status).mean())


def served_wait_s(sim) -> float:
    r = sim.records
    ok = r.status[WARMUP:] == SERVED
    return float((r.start_ns - r.arrival_ns)[WARMUP:][ok].mean() / 1e9)


def test_mm1k_with_a_queue_limit():
    """max_queue_size q, one instance, one row a batch: with a queue policy Triton 2.51
    forms no payload ahead of a free instance (triton_engine, rule 1), so at most q wait
    and one runs: M/M/1/K with K = q + 1 (with prefetching it was K = q + 3)."""
    lam, mu, q = 900.0, 1000.0, 4
    k, rho = q + 1, lam / mu
    p_block = (1 - rho) * rho**k / (1 - rho ** (k + 1))
    in_system = rho / (1 - rho) - (k + 1) * rho ** (k + 1) / (1 - rho ** (k + 1))
    wait = in_system / (lam * (1 - p_block)) - 1 / mu  # Little's law on the accepted
    s = scenario(lam, {"kind": "constant", "latency_ms": 1.0, "variability": "exponential"},
                 max_queue_size=q)
    (pb, pb_half), (w, w_half) = replicate_each(s, [share(REJECTED), served_wait_s])
    check(p_block, pb, pb_half)
    check(wait, w, w_half)


def test_mm1_with_a_deterministic_timeout():
    """default_timeout D, one instance, one row a batch: M/M/1+D. A request leaves at its
    deadline if still queued; FCFS with exponential service, it is served iff the work
    ahead of it at arrival V is under D, and waits V. V's stationary law (Baccelli,
    Boyer and Hebuterne, 1984): an atom P0 at 0, density P0 lam e^(-(mu-lam)v) below D
    and P0 lam e^(-(mu-lam)D) e^(-mu(v-D)) above."""
    lam, mu, d = 900.0, 1000.0, 0.002
    th = mu - lam
    p0 = 1 / (1 + lam * (1 - math.exp(-th * d)) / th + lam * math.exp(-th * d) / mu)
    p_timeout = p0 * lam * math.exp(-th * d) / mu
    below = p0 * lam * (1 / th**2 - math.exp(-th * d) * (d / th + 1 / th**2))  # E[V; V<D]
    wait = below / (1 - p_timeout)
    s = scenario(lam, {"kind": "constant", "latency_ms": 1.0, "variability": "exponential"},
                 default_timeout_microseconds=int(d * 1e6))
    (pt, pt_half), (w, w_half) = replicate_each(s, [share(TIMED_OUT), served_wait_s])
    check(p_timeout, pt, pt_half)
    check(wait, w, w_half)
