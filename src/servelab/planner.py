"""The planner: the fewest GPUs that meet the p99 SLO, and what 1M inferences cost there."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from servelab.batching.analytic import closed_form_gpus
from servelab.batching.service import ServiceModel, build_service_model
from servelab.batching.simulate import simulate
from servelab.report import Report, SearchStep, build_report, meets
from servelab.scenario import Scenario
from servelab.search import fewest_meeting


def _with_gpus(s: Scenario, n: int) -> Scenario:
    return replace(s, hardware=replace(s.hardware, num_gpus=n))


def stability_floor(s: Scenario, service: ServiceModel) -> int:
    """Fewest GPUs whose instances, all running full batches, keep up with the QPS."""
    mbs = s.batching.max_batch_size
    rate = s.batching.instances_per_gpu * float(mbs / service.exec_s(np.array([mbs]))[0])
    return max(1, math.ceil(s.workload.qps / rate))


def latency_floor_ms(s: Scenario, service: ServiceModel) -> float:
    """p99 can never beat fetch + network + one batch of one (at their p99s)."""
    lat = s.latency
    return (lat.median_p99_ms("feature_fetch")[1] + lat.median_p99_ms("network")[1]
            + float(service.exec_s(np.array([1]))[0]) * 1e3)


def plan(s: Scenario) -> Report:
    """Search the GPU count: exponential from the stability floor, then bisection.

    Every count is simulated with the same seed (common random numbers), so the
    comparison between counts is not blurred by sampling noise. p99 is assumed
    to fall as GPUs are added, which holds for this batcher except within noise.
    """
    service = build_service_model(s.model, s.hardware.spec(), s.batching.max_batch_size,
                                  s.resolve_path)
    closed = closed_form_gpus(s, service)
    steps: dict[int, SearchStep] = {}
    reports: dict[int, Report] = {}

    def trial(n: int) -> bool:
        if n not in steps:
            rep = build_report(simulate(_with_gpus(s, n), service))
            reports[n] = rep
            dropped = rep.requests.rejected + rep.requests.timed_out
            ok = meets(rep.latency.p99_ms, rep.gpu.busy_fraction, dropped,
                       s.latency.p99_slo_ms, s.plan.max_busy_fraction)
            steps[n] = SearchStep(n, rep.latency.p99_ms, rep.gpu.busy_fraction, dropped, ok)
        return steps[n].meets

    cap = s.plan.max_gpus
    floor = min(stability_floor(s, service), cap)
    if latency_floor_ms(s, service) > s.latency.p99_slo_ms:
        trial(floor)
        best = floor
    else:
        found = fewest_meeting(trial, floor, cap)
        best = cap if found is None else found  # none meets: the cap's report says so
    chosen = reports[best]
    final = replace(chosen, plan=replace(chosen.plan, closed_form=closed,
                                         search=tuple(steps[k] for k in sorted(steps))))
    if not final.plan.meets_slo:
        floor_ms = latency_floor_ms(s, service)
        why = (f"no GPU count meets it: p99 can never be below {floor_ms:.2f} ms "
               "(fetch + network + a batch of one)" if floor_ms > s.latency.p99_slo_ms
               else f"not met with up to {cap} GPUs (raise [plan] max_gpus)")
        final = replace(final, plan=replace(final.plan, verdict=f"{final.plan.verdict}; {why}"))
    return final
