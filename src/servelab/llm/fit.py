"""Fitting the roofline's constants (``StepParams``) to measured serving runs.

A run is one deployment under one load with its measured TTFT and TPOT medians and output
tokens per second (what `vllm bench serve --save-result` writes). Each is simulated as it
was run and the constants are chosen to minimise the mean squared log error of those
figures: Nelder-Mead (SciPy) over bounded coordinates, since a simulation is a step
function of its inputs and has no useful gradient. Used by `servelab llm fit` (a user's
own runs) and by bench/fit_published_llm.py (the published cases behind the defaults).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from servelab.errors import invalid
from servelab.files import parse_json, read_text, write_text
from servelab.llm.kv import PoolSpec
from servelab.llm.serving import (
    MAX_REQUESTS,
    MAX_TOKENS_PER_REQUEST,
    StepParams,
    Workload,
    nccl_allreduce,
    serve_llm,
)

FIGURES = ("ttft_p50_ms", "tpot_p50_ms", "output_tokens_per_s")
# name, low, high: the range each constant is fitted within
BOUNDS = (("compute_efficiency", 0.2, 1.0), ("compute_ramp_tokens", 0.0, 1000.0),
          ("memory_efficiency", 0.4, 1.0),
          ("kv_memory_efficiency", 0.2, 1.0),
          ("overlap", 1.0, 8.0), ("overhead_ms", 0.0, 5.0),
          ("prefill_first_overhead_ms", 0.0, 5.0), ("per_seq_ms", 0.0, 0.5),
          ("allreduce_latency_us", 0.0, 100.0), ("nccl_allreduce_latency_us", 0.0, 500.0),
          ("frontend_ms", 0.0, 50.0), ("intake_ms", 0.0, 20.0),
          ("intake_per_token_us", 0.0, 100.0), ("pp_hop_ms", 0.0, 50.0))
# what `llm fit` frees by default: the overlap is a property of the kernels, held at the
# published fit (a handful of one deployment's runs cannot tell it from the rest)
USER_FIT = ("compute_efficiency", "memory_efficiency", "overhead_ms", "per_seq_ms",
            "frontend_ms")
_RANGE = {n: (lo, hi) for n, lo, hi in BOUNDS}
MAX_RUNS = 128  # the published fit: 86 runs (its small cases in 16 draws each)
MAX_EVALS = 2000
MAX_RESULT_BYTES = 256 * 2**20  # a --save-detailed file of 100,000 requests is ~100 MB


@dataclass(frozen=True, slots=True)
class Run:
    """One measured run, and how to simulate it."""

    label: str
    spec: PoolSpec
    workload: Workload
    prefill_first: bool
    measured: dict[str, float]  # some of FIGURES
    num_scheduler_steps: int = 1  # vLLM 0.6's multi-step scheduling (prefill_first)
    sglang: bool = False  # SGLang's admission and retraction (prefill_first)


def predict(run: Run, params: StepParams) -> dict[str, float]:
    w = run.workload
    if math.isinf(w.request_rate) and not w.max_concurrency:
        w = replace(w, request_rate=1e6)  # every request at once: a burst 1 us apart
    r = serve_llm(run.spec, w, step_params=params, prefill_first=run.prefill_first,
                  enable_chunked_prefill=not run.prefill_first,
                  num_scheduler_steps=run.num_scheduler_steps, sglang=run.sglang)
    return {"ttft_p50_ms": r.ttft_ms["p50"], "tpot_p50_ms": r.tpot_ms["p50"],
            "output_tokens_per_s": r.output_tokens_per_s}


def log_errors(runs: Sequence[Run], params: StepParams) -> list[float]:
    out = []
    for run in runs:
        pred = predict(run, params)
        for fig, v in run.measured.items():
            p = pred[fig]
            out.append(math.log(p / v) if p > 0 and math.isfinite(p) else 10.0)
    return out


def _to_params(x: np.ndarray, names: Sequence[str], base: StepParams) -> StepParams:
    """Free coordinates to constants: (1 + sin x) / 2 of each range, so every coordinate
    stays in bounds and a step moves it as much near a bound as in the middle (a
    logistic map flattens at its ends and strands a constant that starts there)."""
    vals: dict[str, Any] = {
        n: _RANGE[n][0] + (_RANGE[n][1] - _RANGE[n][0]) * (1 + math.sin(float(v))) / 2
        for n, v in zip(names, x, strict=True)}
    return replace(base, **vals)


def _from_params(p: StepParams, names: Sequence[str]) -> np.ndarray:
    """The inverse, from at least 2% inside each range."""
    out = []
    for n in names:
        lo, hi = _RANGE[n]
        v = getattr(p, n)
        u = min(max((v - lo) / (hi - lo) if math.isfinite(v) else 1.0, 0.02), 0.98)
        out.append(math.asin(2 * u - 1))
    return np.array(out)


@dataclass(frozen=True, slots=True)
class FitResult:
    params: StepParams
    fitted: tuple[str, ...]  # the constants that were free
    rms_log_error: float
    evaluations: int


def default_names(runs: Sequence[Run]) -> list[str]:
    """What `llm fit` frees for a user's runs: USER_FIT, with the step overhead of their
    engine (a user's runs are of one engine), and the latency of the all-reduce each
    tensor-parallel run's GPUs use (vLLM's own kernel, or NCCL beyond two PCIe GPUs)."""
    names = [n if n != "overhead_ms" or not all(r.prefill_first for r in runs)
             else "prefill_first_overhead_ms" for n in USER_FIT]
    return names + sorted({"nccl_allreduce_latency_us" if nccl_allreduce(r.spec.tp, r.spec.gpu)
                           else "allreduce_latency_us" for r in runs if r.spec.tp > 1})


def fit(runs: Sequence[Run], start: StepParams | None = None,
        names: Sequence[str] | None = None, max_evals: int = 400,
        progress: Callable[[int, float], None] | None = None) -> FitResult:
    """The constants in `names` (default: USER_FIT, and the all-reduce's latency when a
    run is tensor parallel) that best reproduce `runs`' figures."""
    from scipy.optimize import least_squares, minimize

    if not 1 <= len(runs) <= MAX_RUNS:
        raise invalid("runs", len(runs), f"1 to {MAX_RUNS} measured runs",
                      "give at least one result file")
    if not 10 <= max_evals <= MAX_EVALS:
        raise invalid("--max-evals", max_evals, f"10 to {MAX_EVALS:,}", "e.g. --max-evals 300")
    base = start or StepParams()
    names = tuple(default_names(runs) if names is None else names)
    if "kv_memory_efficiency" in names and base.kv_memory_efficiency is None:
        # the KV's reads start where the weights' are
        base = replace(base, kv_memory_efficiency=base.kv_read_efficiency)
    lo = np.array([_RANGE[n][0] for n in names])
    span = np.array([_RANGE[n][1] - _RANGE[n][0] for n in names])
    evals = 0
    best, best_params = math.inf, base

    def errors(p: StepParams) -> np.ndarray:
        nonlocal evals, best, best_params
        evals += 1
        e = np.array(log_errors(runs, p))
        v = float(np.mean(np.square(e)))
        if v < best:
            best, best_params = v, p
        if progress:
            progress(evals, v)
        return e

    # 1. Levenberg-Marquardt-like least squares (SciPy's trust region, within the bounds)
    # on each figure's log error, over the constants scaled to their ranges, with finite
    # differences 2% of a range wide (much narrower ones see a simulation's small jumps):
    # it reaches the right basin in tens of simulations. They were 5% until 2026-12-07,
    # when attention priced apart from the GEMMs left a valley between the per-step and
    # per-sequence costs that 5% steps stalled in (the known-constants test: worst figure
    # 2.3% off at 350 simulations with 5%, 0.4% with 2%).
    u0 = np.array([min(max((getattr(base, n) - _RANGE[n][0]) / (_RANGE[n][1] - _RANGE[n][0])
                           if math.isfinite(getattr(base, n)) else 1.0, 0.02), 0.98)
                   for n in names])
    def at(u: np.ndarray) -> StepParams:
        vals: dict[str, Any] = {n: float(v) for n, v in zip(names, lo + span * u, strict=True)}
        return replace(base, **vals)

    least_squares(lambda u: errors(at(u)),
                       u0, bounds=(0.0, 1.0), diff_step=0.02,
                       # each iteration also spends one simulation per constant on
                       # its finite differences: a third of the budget in all
                       max_nfev=max(1, min(100, max_evals // 3 // (len(names) + 1))))
    # (its best point is what errors() kept)

    # 2. Nelder-Mead from there (a simplex half a unit wide in sine-bounded coordinates),
    # restarted smaller while the budget lasts and each pass gains: it polishes where the
    # simulation's steps leave least squares' gradients noisy.
    def loss(x: np.ndarray) -> float:
        return float(np.mean(np.square(errors(_to_params(x, names, best_params)))))

    x = _from_params(best_params, names)
    step = 0.5
    while evals < max_evals - len(names) - 1 and step > 0.05:
        before = best
        simplex = np.vstack([x, *(x + step * np.eye(len(names))[i]
                                  for i in range(len(names)))])
        minimize(loss, x, method="Nelder-Mead",
                 options={"maxfev": max_evals - evals, "xatol": 1e-3, "fatol": 1e-7,
                          "initial_simplex": simplex})
        if best >= before * (1 - 1e-3):
            step /= 4
        x = _from_params(best_params, names)
    return FitResult(best_params, names, math.sqrt(best), evals)


# -- vllm bench serve --save-result files ---------------------------------------------
def _number(d: dict[str, Any], key: str, path: str, lo: float, hi: float,
            required: bool = True) -> float | None:
    v = d.get(key)
    if v is None and not required:
        return None
    if v == "inf" and hi == math.inf:
        return math.inf
    if isinstance(v, bool) or not isinstance(v, int | float) or not (
            math.isfinite(v) or hi == math.inf) or not lo <= v <= hi:
        raise invalid(f"{path}: {key}", v, f"a number from {lo:g} to {hi:g}",
                      "give the file `vllm bench serve --save-result` wrote")
    return float(v)


def _lens(d: dict[str, Any], key: str, path: str) -> np.ndarray | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_REQUESTS or any(
            isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <=
            MAX_TOKENS_PER_REQUEST for x in v):
        shown = f"a list of {len(v):,}" if isinstance(v, list) else type(v).__name__
        raise invalid(f"{path}: {key}", shown,
                      f"a list of up to {MAX_REQUESTS:,} token counts",
                      "give the file vLLM wrote, or drop the list")
    return np.asarray(v, dtype=np.int64)


def run_from_vllm_result(path: Path, spec: PoolSpec, prefill_first: bool = False,
                         seed: int = 0, num_scheduler_steps: int = 1,
                         sglang: bool = False) -> Run:
    """A run from a `vllm bench serve --save-result` JSON file (and the server's settings,
    which the file does not hold). With `input_lens`/`output_lens` (--save-detailed) each
    request keeps its lengths; otherwise every request gets the run's mean lengths."""
    name = str(path)
    d = parse_json(read_text(path, name, what="vllm bench serve --save-result JSON",
                             max_bytes=MAX_RESULT_BYTES), name)
    if not isinstance(d, dict):
        raise invalid(name, type(d).__name__, "a JSON object (vLLM's result file)",
                      "give the file `vllm bench serve --save-result` wrote")
    done = int(_number(d, "completed", name, 1, MAX_REQUESTS) or 1)
    rate = _number(d, "request_rate", name, 1e-6, math.inf) or math.inf
    burst = _number(d, "burstiness", name, 0.01, 100, required=False) or 1.0
    conc = int(_number(d, "max_concurrency", name, 1, 100_000, required=False) or 0)
    measured = {"ttft_p50_ms": _number(d, "median_ttft_ms", name, 1e-6, 1e9),
                "tpot_p50_ms": _number(d, "median_tpot_ms", name, 1e-6, 1e9),
                "output_tokens_per_s": _number(d, "output_throughput", name, 1e-6, 1e9)}
    ins, outs = _lens(d, "input_lens", name), _lens(d, "output_lens", name)
    lengths = None
    if ins is not None and outs is not None and ins.size == outs.size:
        keep = (ins > 0) & (outs > 0)  # a failed request's lengths are 0
        if keep.any():
            lengths = (ins[keep], outs[keep])
    tin = _number(d, "total_input_tokens", name, 1, 1e12)
    tout = _number(d, "total_output_tokens", name, 1, 1e12)
    w = Workload(request_rate=rate, num_requests=done if lengths is None else lengths[0].size,
                 prompt_tokens=max(1.0, (tin or 1) / done),
                 output_tokens=max(1.0, (tout or 1) / done), seed=seed,
                 max_concurrency=conc, burstiness=burst, lengths=lengths)
    label = f"{path.name} ({'inf' if math.isinf(rate) else f'{rate:g}'}/s" + (
        f", {conc} at once" if conc else "") + ")"
    return Run(label, spec, w, prefill_first or sglang,
               {k: v for k, v in measured.items() if v is not None}, num_scheduler_steps,
               sglang=sglang)


def vllm_result(report: Any, workload: Workload) -> dict[str, Any]:
    """A simulated run (a ServingReport) in `vllm bench serve --save-result`'s keys
    (what `llm fit` reads)."""
    per_request = report.per_request
    ttft, tpot, e2e = (per_request[k] for k in ("ttft_s", "tpot_s", "e2e_s"))
    ok = np.isfinite(ttft)
    ins, outs = per_request["prompt"], per_request["output"]
    dur = float(per_request["duration_s"])

    def stats(name: str, x: np.ndarray) -> dict[str, float]:
        x = x[np.isfinite(x)] * 1e3
        if not x.size:
            return {}
        return {f"mean_{name}_ms": float(x.mean()), f"median_{name}_ms": float(np.median(x)),
                f"std_{name}_ms": float(x.std()), f"p99_{name}_ms": float(np.percentile(x, 99))}

    return {
        "backend": "servelab-simulate", "model_id": report.model,
        "num_prompts": int(ins.size), "completed": int(ok.sum()),
        "request_rate": "inf" if math.isinf(workload.request_rate) else workload.request_rate,
        "burstiness": workload.burstiness,
        "max_concurrency": workload.max_concurrency or None,
        "duration": dur, "total_input_tokens": int(ins[ok].sum()),
        "total_output_tokens": int(outs[ok].sum()),
        "request_throughput": float(ok.sum() / dur) if dur > 0 else 0.0,
        "output_throughput": float(outs[ok].sum() / dur) if dur > 0 else 0.0,
        **stats("ttft", ttft), **stats("tpot", tpot), **stats("e2el", e2e),
        "input_lens": [int(x) for x in ins], "output_lens": [int(x) for x in outs],
    }


def write_json(path: Path, d: dict[str, Any]) -> None:
    write_text(path, json.dumps(d, allow_nan=False), "--save-result")


__all__ = ["BOUNDS", "FIGURES", "FitResult", "Run", "fit", "log_errors", "predict",
           "run_from_vllm_result", "vllm_result", "write_json"]
