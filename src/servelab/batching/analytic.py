"""Closed-form first estimates of the batcher, labelled as such wherever shown.

These are back-of-envelope formulas, not the answer: the simulator is. They
are shown next to the simulated figures so a reader can see where intuition
and the queue part ways.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from servelab.batching.service import ServiceModel
from servelab.scenario import Scenario


@dataclass(frozen=True, slots=True)
class ClosedForm:
    """Estimates for one GPU count. Times in ms."""

    num_gpus: int
    mean_batch_size: float
    busy_fraction: float
    exec_ms: float
    mean_queue_ms: float
    p99_ms: float
    stable: bool


def batch_to_keep_up(qps: float, service: ServiceModel, instances: int, max_batch: int) -> float:
    """Smallest batch with which `instances` instances keep up with `qps` (inf if none)."""
    b = np.arange(1, max_batch + 1, dtype=np.float64)
    ok = instances * b / service.exec_s(b) >= qps
    return float(b[np.argmax(ok)]) if ok.any() else math.inf


def estimate(s: Scenario, service: ServiceModel, num_gpus: int) -> ClosedForm:
    """First estimate at `num_gpus`.

    Batch: a window opened by one Poisson arrival collects lambda*W more, so
    b = 1 + lambda*W (not lambda*W), unless the instances need bigger batches
    to keep up; capped at max_batch_size. Busy: rho = lambda*t(b)/(b*c).
    Queue: the opener waits W, the others W/2 on average; a busy instance adds
    an M/D/1-style rho/(2(1-rho)) * t(b). p99: fetch + network + W + t(b),
    plus the same busy term, five-fold for the tail.
    """
    qps = s.workload.qps
    b_pol = s.batching
    c = num_gpus * b_pol.instances_per_gpu
    w_s = b_pol.max_queue_delay_microseconds / 1e6
    b_win = 1.0 + qps * w_s if w_s > 0 else 1.0
    b = min(float(b_pol.max_batch_size), max(b_win, batch_to_keep_up(qps, service, c,
                                                                      b_pol.max_batch_size)))
    t = float(service.exec_s(np.array([b]))[0])
    rho = qps * t / (b * c)
    stable = rho < 1.0
    wait_busy = rho / (2 * (1 - rho)) * t if stable else math.inf
    lam_w = qps * w_s
    window_wait = (w_s + lam_w * w_s / 2) / (1 + lam_w) if w_s > 0 else 0.0
    window_wait = min(window_wait, w_s)
    lat = s.latency
    fetch99 = lat.median_p99_ms("feature_fetch")[1]
    net99 = lat.median_p99_ms("network")[1]
    p99 = fetch99 + net99 + (w_s + t + 5 * wait_busy) * 1e3
    return ClosedForm(
        num_gpus=num_gpus,
        mean_batch_size=b,
        busy_fraction=min(rho, 1.0),
        exec_ms=t * 1e3,
        mean_queue_ms=(window_wait + wait_busy) * 1e3,
        p99_ms=p99,
        stable=stable,
    )


def closed_form_gpus(s: Scenario, service: ServiceModel) -> ClosedForm | None:
    """Fewest GPUs whose estimate meets the SLO and busy ceiling (None if none up to max_gpus)."""
    lo, hi = 1, s.plan.max_gpus

    def ok(n: int) -> bool:
        e = estimate(s, service, n)
        return e.stable and e.busy_fraction <= s.plan.max_busy_fraction and (
            e.p99_ms <= s.latency.p99_slo_ms)

    if not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return estimate(s, service, lo)
