"""A scenario's [llm] section as `servelab llm simulate` runs it: one replica's vLLM
deployment, the workload, the scheduler's switches and the step model. The CLI
(`llm simulate|plan`), the Python API and the lab's LLM serving section all start
here, so a scenario file gives the same figures in each."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from servelab.llm.pool import pool_spec
from servelab.scenario import LlmPool, Scenario

# The roofline's constants, each an [llm] key (None: the defaults fitted to published runs)
STEP_KEYS = ("compute_efficiency", "compute_ramp_tokens", "memory_efficiency",
             "kv_memory_efficiency", "overhead_ms",
             "prefill_first_overhead_ms", "per_seq_ms", "overlap", "allreduce_latency_us",
             "nccl_allreduce_latency_us", "pp_hop_ms", "frontend_ms", "intake_ms",
             "intake_per_token_us")


def llm_of(s: Scenario) -> LlmPool:
    """The scenario's [llm], or the defaults for a scenario without one."""
    return s.llm if s.llm is not None else LlmPool()


def step_profile(s: Scenario, llm: LlmPool) -> Any:
    """[llm] step_profile_csv as a fitted step model, or None (the roofline)."""
    from servelab.llm.serving import ProfileStepModel

    path = llm.step_profile_csv
    if path is None:
        return None
    model = ProfileStepModel.from_csv(str(s.resolve_path(path, "[llm] step_profile_csv")))
    return replace(model, after_prefill_ms=llm.after_prefill_ms)


def llm_workload(s: Scenario, llm: LlmPool, seed: int, num_requests: int | None = None
                 ) -> Any:
    """The requests [llm] describes (num_requests: that many instead of its own)."""
    from servelab.llm.paging import read_lengths_csv
    from servelab.llm.serving import MAX_REQUESTS, MAX_TOKENS_PER_REQUEST, Workload

    lengths = None
    if llm.lengths_csv is not None:
        lengths = read_lengths_csv(s.resolve_path(llm.lengths_csv, "[llm] lengths_csv"),
                                   MAX_REQUESTS, "--lengths", MAX_TOKENS_PER_REQUEST)
    return Workload(lengths=lengths, request_rate=llm.request_rate,
                    num_requests=num_requests or llm.num_requests, arrival=llm.arrival,
                    max_concurrency=llm.max_concurrency, burstiness=llm.burstiness,
                    prompt_tokens=llm.prompt_tokens, prompt_tokens_p99=llm.prompt_tokens_p99,
                    output_tokens=llm.output_tokens,
                    output_tokens_p99=llm.output_tokens_p99, seed=seed)


def serving_options(s: Scenario, llm: LlmPool) -> dict[str, Any]:
    """The scheduler's switches and the step model, as `serve_llm` and `plan_llm` take them."""
    from servelab.llm.serving import StepParams

    given = {k: getattr(llm, k) for k in STEP_KEYS if getattr(llm, k) is not None}
    return {"enable_chunked_prefill": llm.enable_chunked_prefill,
            "enable_prefix_caching": llm.enable_prefix_caching,
            "prefix_tokens": llm.prefix_tokens, "prefix_hit_share": llm.prefix_hit_share,
            "step_profile": step_profile(s, llm), "step_params": StepParams(**given),
            "prefill_first": llm.scheduler in ("prefill-first", "sglang"),
            "sglang": llm.scheduler == "sglang",
            "llama_cpp": llm.scheduler == "llama.cpp", "max_model_len": llm.max_model_len,
            "num_scheduler_steps": llm.num_scheduler_steps}


def simulate_llm(s: Scenario, *, seed: int = 0, num_requests: int | None = None,
                 workload: Any = None, **overrides: Any) -> Any:
    """`servelab llm simulate --scenario`: [llm] replicas of one replica's deployment
    (pool_spec of [llm]), the workload and switches as [llm] gives them. `workload`: one
    already built by llm_workload (the CLI keeps it for --save-result); `overrides`
    replace serve_llm's options (the lab gives a validated server's step model)."""
    from servelab.llm.serving import serve_llm

    llm = llm_of(s)
    s = replace(s, llm=llm)
    options = {**serving_options(s, llm), **overrides}
    if workload is None:
        workload = llm_workload(s, llm, seed, num_requests)
    return serve_llm(pool_spec(s), workload, replicas=llm.replicas, **options)
