"""The Python API: the same functions the CLI and the lab call.

    >>> import servelab
    >>> s = servelab.load("seed", {"workload.qps": 4000})
    >>> report = servelab.run_plan(s)
    >>> report.plan.num_gpus, report.latency.p99_ms
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from servelab.batching.analytic import estimate
from servelab.batching.simulate import simulate
from servelab.errors import InputError, closest, invalid
from servelab.planner import plan
from servelab.report import Report, build_report, p99_interval_ms
from servelab.scenario import Scenario, load_scenario, sweep_names, sweep_params


def load(source: str, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """A scenario file (or 'seed') with flat ``section.key`` overrides (None: not given)."""
    s = load_scenario(source)
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    return s.with_overrides(given) if given else s


def run_simulate(s: Scenario, *, p99_interval: bool = False) -> Report:
    """Simulate the scenario as given; the closed-form estimate at its GPU count alongside.
    With `p99_interval`, the Report's latency carries the p99's 95% interval (batch means;
    it costs about as much again as the report)."""
    sim = simulate(s)
    report = build_report(sim, closed_form=estimate(s, sim.service, s.hardware.num_gpus))
    if not p99_interval:
        return report
    interval = p99_interval_ms(sim, report.latency.p99_ms)
    return replace(report, latency=replace(report.latency, p99_interval_ms=interval))


def run_plan(s: Scenario) -> Report:
    """The fewest GPUs meeting the scenario's p99 SLO, and the report there."""
    return plan(s)


def run_sweep(s: Scenario, param: str, values: Sequence[float], *, plan: bool = False,
              on_step: Callable[[], object] | None = None) -> list[dict[str, Any]]:
    """One row of key figures per value of `param` (simulated, or planned with plan=True)."""
    params = sweep_params()
    if param not in params:
        guess = closest(param, params)
        several = [n for n in params if n.endswith(f".{param}")]
        listed = f"one of {', '.join(sweep_names())}"  # long: only when nothing is close
        raise invalid("sweep parameter", param, "a number of the scenario's [workload], "
                      "[batching], [hardware], [model], [latency] or [plan]"
                      if several or guess else listed,
                      f"give it as {' or '.join(several)}" if several
                      else f"did you mean {guess!r}?" if guess else "pick one of those")
    key, whole = params[param]
    rows = []
    for v in values:
        if whole and float(v) != int(v):
            raise invalid(param, v, "whole numbers", f"give whole values for {param}")
        value: float | int = int(v) if whole else float(v)
        try:
            point = s.with_overrides({key: value})
        except InputError as exc:
            raise InputError(f"sweep {param} = {value!r}: {exc}") from None
        r = run_plan(point) if plan else run_simulate(point)
        rows.append(_finite({
            param: value,
            "num_gpus": r.plan.num_gpus,
            "mean_batch_size": r.batching.mean_batch_size,
            "busy_fraction": r.gpu.busy_fraction,
            "batch_efficiency": r.gpu.batch_efficiency,
            "mean_queue_ms": r.latency.mean_queue_ms,
            "p50_ms": r.latency.p50_ms,
            "p99_ms": r.latency.p99_ms,
            "served_per_s": r.throughput.served_per_s,
            # What the GPUs would serve if kept busy with batches like these.
            "capacity_per_s": (r.throughput.served_per_s / r.gpu.busy_fraction
                               if r.gpu.busy_fraction > 0 else None),
            "rejected": r.requests.rejected,
            "timed_out": r.requests.timed_out,
            "cost_per_million_usd": r.plan.cost_per_million_usd,
            "meets_slo": r.plan.meets_slo,
        }))
        if on_step is not None:
            on_step()
    return rows


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """A figure that does not exist (p50 of no served request) is None, as in the Report."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in row.items()}


# -- measuring real servers (imported on first use: they pull in HTTP clients) ----------


def run_load(url: str, model: str, spec: Any, **options: Any) -> Any:
    """Load a v2 server (`measure.load.run_load`): a typed `LoadReport`. `spec` is a
    `servelab.measure.load.LoadSpec`."""
    from servelab.measure.load import run_load as run

    return run(url, model, spec, **options)


def run_validation(spec: Any, **options: Any) -> Any:
    """Profile, fit and validate a v2 server (`measure.validate.run_validation`): a typed
    `ValidationReport`. `spec` is a `servelab.measure.validate.ValidationSpec`."""
    from servelab.measure.validate import run_validation as run

    return run(spec, **options)


def run_llm_simulate(s: Scenario, *, seed: int = 0) -> Any:
    """`servelab llm simulate --scenario`: the scenario's [llm] deployment and workload
    through vLLM V1's scheduler (an LlmServingReport; `.to_dict()` is the --json)."""
    from servelab.llm.from_scenario import simulate_llm

    return simulate_llm(s, seed=seed)


def run_llm_load(endpoint: Any, make_requests: Any, plans: Any, **options: Any) -> Any:
    """Load an OpenAI-compatible LLM server (`measure.llm_load.run_load`): a typed
    `LlmLoadReport`. Async: await it, or asyncio.run it."""
    from servelab.measure.llm_load import run_load as run

    return run(endpoint, make_requests, plans, **options)


def run_llm_validation(endpoint: Any, **options: Any) -> Any:
    """Profile, fit and validate an LLM server (`measure.llm_validate.run_validation`): a
    typed `LlmValidationReport`. Async: await it, or asyncio.run it."""
    from servelab.measure.llm_validate import run_validation

    return run_validation(endpoint, **options)
