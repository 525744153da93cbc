"""The lab's "LLM serving" section: `servelab llm simulate` for the page's sliders, with
bounded work (at most 2,000 requests a run, 400 a point of the rate sweep)."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field

from servelab.catalog import get_gpu
from servelab.errors import invalid
from servelab.llm.kv import KV_DTYPES, PoolSpec
from servelab.llm.models import get_model, model_names
from servelab.llm.serving import ProfileStepModel, StepParams, Workload, serve_llm

RUN_REQUESTS = 2_000
SWEEP_REQUESTS = 400
# Bounded work a move: requests are fewer when they are long (prompt + output tokens
# simulated at about 1M a second, bench/bench_llm.py), so no page can take the server for long.
RUN_TOKENS = 1_000_000
SWEEP_TOKENS = 200_000
MIN_REQUESTS = 50
SWEEP_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


class LlmFit(BaseModel):
    """A server's fit from `servelab llm validate` (its validation.json, read in the page):
    the step model's four terms, the time a request spends outside the steps, and the
    KV pool as the server holds it. Bounded like every other input."""

    base_ms: float = Field(ge=0, le=100_000)
    per_prefill_token_ms: float = Field(ge=0, le=100_000)
    per_decode_seq_ms: float = Field(ge=0, le=100_000)
    per_kv_token_ms: float = Field(ge=0, le=100_000)
    overhead_ms: float = Field(0.0, ge=0, le=600_000)
    num_blocks: int = Field(ge=1, le=10_000_000)
    label: str = Field("", max_length=200)


class LlmIn(BaseModel):
    model: str = Field("llama-3.1-8b", max_length=100)
    gpu: str = Field("H100-SXM", max_length=100)
    kv_dtype: str = Field("auto", max_length=20)
    tp: int = Field(1, ge=1, le=64)
    replicas: int = Field(1, ge=1, le=64)
    rate: float = Field(5.0, gt=0, le=10_000)
    prompt_tokens: int = Field(512, ge=1, le=32_768)
    output_tokens: int = Field(256, ge=1, le=8_192)
    max_num_seqs: int = Field(256, ge=1, le=4_096)
    max_num_batched_tokens: int = Field(8192, ge=16, le=131_072)
    fitted: LlmFit | None = None  # a validated server's step model instead of the roofline


def spec_of(q: LlmIn) -> PoolSpec:
    if q.model not in model_names():
        raise invalid("model", q.model, f"one of {', '.join(model_names())}",
                      "pick a catalog model")
    if q.kv_dtype not in ("auto", *KV_DTYPES):
        raise invalid("kv_dtype", q.kv_dtype, f"auto or one of {', '.join(KV_DTYPES)}",
                      "e.g. fp8")
    return PoolSpec(model=get_model(q.model), gpu=get_gpu(q.gpu), kv_dtype=q.kv_dtype,
                    num_gpus=q.tp, tp=q.tp, max_num_seqs=q.max_num_seqs,
                    max_num_batched_tokens=q.max_num_batched_tokens,
                    context_tokens=q.prompt_tokens + q.output_tokens,
                    num_gpu_blocks_override=q.fitted.num_blocks if q.fitted else None)


def _step_model(f: LlmFit | None) -> ProfileStepModel | None:
    if f is None:
        return None
    return ProfileStepModel(f.base_ms, f.per_prefill_token_ms, f.per_decode_seq_ms,
                            f.per_kv_token_ms, rows=0, max_abs_error_pct=0.0,
                            source=f"llm validate's fit of {f.label or 'a server'}")


def run(q: LlmIn) -> dict[str, Any]:
    spec = spec_of(q)

    def workload(rate: float, n: int) -> Workload:
        return Workload(request_rate=rate, num_requests=n, prompt_tokens=q.prompt_tokens,
                        output_tokens=q.output_tokens)

    per = q.prompt_tokens + q.output_tokens
    n_run = max(MIN_REQUESTS, min(RUN_REQUESTS, RUN_TOKENS // per))
    n_sweep = max(MIN_REQUESTS, min(SWEEP_REQUESTS, SWEEP_TOKENS // per))
    step = _step_model(q.fitted)
    # the time a request spends outside the steps, added to TTFT and E2EL: validate's
    # measurement with a fit, else the default fitted to published runs
    params = StepParams(frontend_ms=q.fitted.overhead_ms) if q.fitted else StepParams()
    outside = params.frontend_ms
    report = serve_llm(spec, workload(q.rate, n_run), replicas=q.replicas,
                       step_profile=step, step_params=params).to_dict()
    if q.fitted:
        report["notes"].append(f"TTFT and E2EL include {outside:.2f} ms a request spends "
                               "outside the steps, as validate measured it")
    sweep = []
    for f in SWEEP_FACTORS:
        r = serve_llm(spec, workload(q.rate * f, n_sweep), replicas=q.replicas,
                      step_profile=step, step_params=params)
        sweep.append({"rate": q.rate * f, "ttft_p99_ms": _num(r.ttft_ms["p99"]),
                      "tpot_p99_ms": _num(r.tpot_ms["p99"])})
    report["gpus"] = q.replicas * q.tp
    report["sweep"] = sweep
    report["requests_simulated"] = n_run
    return report


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None
