"""The lab's "LLM serving" section: `servelab llm simulate --scenario` of the page's own
scenario (its [llm] is the page's one deployment, the KV pool's too), with bounded work
(at most 2,000 requests a run, 400 a point of the rate sweep)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from servelab.errors import invalid
from servelab.llm.from_scenario import llm_of, simulate_llm
from servelab.llm.pool import pool_spec
from servelab.llm.serving import ProfileStepModel, StepParams
from servelab.scenario import LlmPool, Scenario

RUN_REQUESTS = 2_000
SWEEP_REQUESTS = 400
# Bounded work a move: requests are fewer when they are long (prompt + output tokens
# simulated at about 1M a second, bench/bench_llm.py), so no page can take the server for long.
RUN_TOKENS = 1_000_000
SWEEP_TOKENS = 200_000
MIN_REQUESTS = 50
# A preview simulates this fraction of the full run's requests: a faded, rough figure while
# a slider moves (its cost is the steps simulated, which grow with the traffic's span).
PREVIEW_SHARE = 16
SWEEP_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


class LlmFit(BaseModel):
    """A server's fit from `servelab llm validate` (its validation.json, read in the page):
    the step model's terms, the time a request spends outside the steps, and the
    KV pool as the server holds it. Bounded like every other input."""

    base_ms: float = Field(ge=0, le=100_000)
    per_prefill_token_ms: float = Field(ge=0, le=100_000)
    per_decode_seq_ms: float = Field(ge=0, le=100_000)
    per_kv_token_ms: float = Field(ge=0, le=100_000)
    multi_token_ms: float = Field(0.0, ge=0, le=100_000)  # absent before 2026-12-03
    overhead_ms: float = Field(0.0, ge=0, le=600_000)
    num_blocks: int = Field(ge=1, le=10_000_000)
    label: str = Field("", max_length=200)
    # the server's scheduling rule: llama.cpp's slots and ubatches, or vLLM v1's
    rule: Literal["vllm-v1", "llama.cpp"] = "vllm-v1"
    ctx_per_slot: int | None = Field(None, ge=1, le=10_000_000)  # llama.cpp's -c / -np


class LlmIn(BaseModel):
    """The section's question: the page's scenario state (the same flat keys as
    /api/update's: its [llm] is the one deployment of the page, the KV pool's and
    serving's), and optionally a validated server's fit."""

    model_config = ConfigDict(extra="forbid")  # a field the section does not take: 400

    state: dict[str, Any] = Field(default_factory=dict)
    fitted: LlmFit | None = None  # a validated server's step model instead of the roofline
    # While a slider moves: a sixteenth of the requests (the page fades the read-outs and
    # keeps the charts); the full run follows when it is let go.
    preview: bool = False
    # The rate chart's sweep alone, asked for after the run's read-outs have painted (the
    # read-outs never wait for the chart, as the sidebar's never wait for /api/charts).
    sweep: bool = False


# Longest mean lengths the section simulates: with MIN_REQUESTS a run, the work stays
# bounded (RUN_TOKENS caps the rest).
MAX_PROMPT_TOKENS = 32_768
MAX_OUTPUT_TOKENS = 8_192


def one_deployment(s: Scenario) -> Scenario:
    """The page's [llm] as one deployment: num_gpus GPUs in replicas of tp (the KV pool's
    reading), so serving runs num_gpus / tp replicas; the returned scenario says so in
    [llm] replicas, as `llm simulate --scenario` reads it."""
    llm = llm_of(s)
    return replace(s, llm=replace(llm, replicas=max(1, llm.num_gpus // (llm.tensor_parallel
                                                                          * llm.pp))))


def _checked(llm: LlmPool) -> None:
    for key, v, top in (("prompt_tokens", llm.prompt_tokens, MAX_PROMPT_TOKENS),
                        ("prompt_tokens_p99", llm.prompt_tokens_p99, MAX_PROMPT_TOKENS),
                        ("output_tokens", llm.output_tokens, MAX_OUTPUT_TOKENS),
                        ("output_tokens_p99", llm.output_tokens_p99, MAX_OUTPUT_TOKENS)):
        if v is not None and v > top:
            raise invalid(f"[llm] {key}", v, f"at most {top:,} tokens in the lab",
                          "a shorter length, or `servelab llm simulate` for longer ones")
    if llm.lengths_csv is not None or llm.step_profile_csv is not None:
        raise invalid("[llm] lengths_csv" if llm.lengths_csv is not None
                      else "[llm] step_profile_csv", "a file", "no file in the lab",
                      "run `servelab llm simulate --scenario` with the file")


def _step_model(f: LlmFit) -> ProfileStepModel:
    return ProfileStepModel(f.base_ms, f.per_prefill_token_ms, f.per_decode_seq_ms,
                            f.per_kv_token_ms, rows=0, max_abs_error_pct=0.0,
                            source=f"llm validate's fit of {f.label or 'a server'}",
                            multi_token_ms=f.multi_token_ms)


def _prepared(s: Scenario, fitted: LlmFit | None) -> tuple[Scenario, dict[str, Any]]:
    """The page's scenario as one checked deployment, and serve_llm's options for a
    validated server's fit (its step model, KV blocks and outside time)."""
    s = one_deployment(s)
    llm = llm_of(s)
    _checked(llm)
    if fitted is None:
        return s, {}
    if fitted.rule == "llama.cpp":  # the server's slots and ubatches (llm/llama_cpp.py)
        llm = replace(llm, scheduler="llama.cpp",
                      context_tokens=fitted.ctx_per_slot or llm.context_tokens)
    return (replace(s, llm=replace(llm, num_gpu_blocks_override=fitted.num_blocks)),
            {"step_profile": _step_model(fitted),
             "step_params": StepParams(frontend_ms=fitted.overhead_ms, intake_ms=0.0,
                                        intake_per_token_us=0.0)})


def sweep(s: Scenario, fitted: LlmFit | None = None) -> dict[str, Any]:
    """The rate chart: p99 TTFT and TPOT at SWEEP_FACTORS of the page's rate, each at
    SWEEP_REQUESTS (fewer for long requests)."""
    s, overrides = _prepared(s, fitted)
    llm = llm_of(s)
    per = llm.prompt_tokens + llm.output_tokens
    n_sweep = max(MIN_REQUESTS, min(SWEEP_REQUESTS, int(SWEEP_TOKENS // per)))
    points = []
    for f in SWEEP_FACTORS:
        at = replace(s, llm=replace(llm, request_rate=llm.request_rate * f))
        r = simulate_llm(at, num_requests=n_sweep, **overrides)
        points.append({"rate": llm.request_rate * f, "ttft_p99_ms": _num(r.ttft_ms["p99"]),
                       "tpot_p99_ms": _num(r.tpot_ms["p99"])})
    return {"sweep": points, "requests_a_point": n_sweep}


def run(s: Scenario, fitted: LlmFit | None = None, preview: bool = False) -> dict[str, Any]:
    """`llm simulate --scenario` of the page's scenario, bounded: at most RUN_REQUESTS
    (fewer for long requests), a sixteenth of them for a preview. With a validated
    server's fit, its step model, KV blocks and outside time replace the roofline's."""
    s, overrides = _prepared(s, fitted)
    llm = llm_of(s)
    per = llm.prompt_tokens + llm.output_tokens
    n_full = max(MIN_REQUESTS, min(RUN_REQUESTS, int(RUN_TOKENS // per), llm.num_requests))
    n_run = max(MIN_REQUESTS, n_full // PREVIEW_SHARE) if preview else n_full
    spec = pool_spec(s)
    report: dict[str, Any] = simulate_llm(s, num_requests=n_run, **overrides).to_dict()
    if fitted is not None:
        report["notes"].append(f"TTFT and E2EL include {fitted.overhead_ms:.2f} ms a request "
                               "spends outside the steps, as validate measured it")
    report["gpus"] = llm.replicas * llm.tensor_parallel * llm.pp
    report["requests_simulated"] = n_run
    report["max_num_seqs"] = spec.max_num_seqs
    report["max_num_batched_tokens"] = spec.max_num_batched_tokens
    report["preview"] = preview
    if preview:
        report["notes"].append(f"preview while the slider moves: {n_run:,} of {n_full:,} "
                               "requests, the charts unchanged; the full run follows "
                               "on release")
        del report["kv_usage"]  # the KV chart waits for the full run
    return report


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None
