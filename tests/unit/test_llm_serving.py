"""The LLM serving simulator (vLLM v1's scheduler): hand-worked cases with a step model
whose times are known exactly, and properties over random workloads."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.llm.serving import (
    Requests,
    SchedulerConfig,
    StepModel,
    Workload,
    lognormal_lengths,
    serve_llm,
    simulate_serving,
)

# A step model with round numbers: 1 ms per step of weights, +0.01 ms per token of
# compute when that exceeds it; no KV traffic, no attention, no overhead.
FLAT = StepModel(weight_bytes=1e9, kv_bytes_per_token=0.0, flops_per_token=1e10,
                 attn_flops_per_context_token=0.0, peak_flops=1e15, hbm_bytes_per_s=1e12,
                 compute_efficiency=1.0, memory_efficiency=1.0, overhead_s=0.0)


def step_ms(tokens: int) -> float:
    return max(tokens * 1e10 / 1e15, 1e9 / 1e12) * 1e3  # 0.01 ms a token, at least 1 ms


def reqs(arrivals, prompts, outputs, hits=None) -> Requests:  # type: ignore[no-untyped-def]
    n = len(arrivals)
    return Requests(np.asarray(arrivals, float), np.asarray(prompts, np.int64),
                    np.asarray(outputs, np.int64),
                    np.asarray(hits if hits is not None else [False] * n))


def test_one_request_alone():
    r = simulate_serving(reqs([0.0], [500], [11]), SchedulerConfig(num_blocks=1000), FLAT)
    assert r.ttft_s[0] * 1e3 == pytest.approx(step_ms(500))  # one prefill step: 5 ms
    assert r.tpot_s[0] * 1e3 == pytest.approx(step_ms(1))  # each decode: the weights, 1 ms
    assert r.e2e_s[0] * 1e3 == pytest.approx(step_ms(500) + 10 * step_ms(1))
    assert r.steps == 11
    assert r.prefill_tokens == 500
    assert r.decode_tokens == 10


def test_requests_that_exactly_fill_the_token_budget_share_one_step():
    cfg = SchedulerConfig(num_blocks=1000, max_num_batched_tokens=1000)
    r = simulate_serving(reqs([0.0, 0.0, 0.0], [600, 400, 10], [2, 2, 2]), cfg, FLAT)
    # 600 + 400 fill the budget in step 1; the third waits for step 2 (with 2 decodes).
    assert r.ttft_s[0] == r.ttft_s[1]
    assert r.ttft_s[0] * 1e3 == pytest.approx(step_ms(1000))
    assert r.ttft_s[2] * 1e3 == pytest.approx(step_ms(1000) + step_ms(12))


def test_a_pool_that_forces_one_preemption_at_a_known_step():
    # block_size 1, 10 blocks: A (prompt 4, output 4) ends holding 7, B (3, 3) 5: 12 > 10.
    cfg = SchedulerConfig(num_blocks=10, block_size=1)
    r = simulate_serving(reqs([0.0, 0.0], [4, 3], [4, 3]), cfg, FLAT)
    # step 1: both prefill (7 blocks); step 2: both decode (9); step 3: A takes the last
    # block and B, the most recently admitted, is preempted (recompute).
    assert r.preemptions.tolist() == [0, 1]
    assert r.preempt_time_s.tolist() == pytest.approx([2 * step_ms(7) / 1e3])
    assert r.generated.tolist() == [4, 3]
    assert not r.rejected.any()
    assert r.kv_blocks.max() <= 10


def test_chunked_prefill_splits_a_long_prompt():
    cfg = SchedulerConfig(num_blocks=10_000, max_num_batched_tokens=4096)
    r = simulate_serving(reqs([0.0], [10_000], [1]), cfg, FLAT)
    assert r.steps == 3  # 4096 + 4096 + 1808
    assert r.ttft_s[0] * 1e3 == pytest.approx(2 * step_ms(4096) + step_ms(1808))
    off = simulate_serving(reqs([0.0], [10_000], [1]),
                           SchedulerConfig(num_blocks=10_000, max_num_batched_tokens=4096,
                                           enable_chunked_prefill=False), FLAT)
    assert off.rejected.tolist() == [True]  # a whole prompt can never fit the budget


def test_prefix_caching_halves_prefill_when_half_of_every_prompt_is_shared():
    n = 20
    plain = SchedulerConfig(num_blocks=100_000, block_size=16, max_num_batched_tokens=8192)
    cached = SchedulerConfig(num_blocks=100_000, block_size=16, max_num_batched_tokens=8192,
                             enable_prefix_caching=True, prefix_tokens=512,
                             prefix_hit_share=1.0)
    r0 = simulate_serving(reqs(np.arange(n) * 0.1, [1024] * n, [4] * n), plain, FLAT)
    r1 = simulate_serving(reqs(np.arange(n) * 0.1, [1024] * n, [4] * n, [True] * n), cached,
                          FLAT)
    assert r0.prefill_tokens == n * 1024
    assert r1.prefill_tokens == n * 512


def test_lognormal_lengths_hit_their_mean_and_p99():
    x = lognormal_lengths(500, 2000, 200_000, np.random.default_rng(0), "--prompt-tokens")
    assert x.mean() == pytest.approx(500, rel=0.02)
    assert np.percentile(x, 99) == pytest.approx(2000, rel=0.03)
    with pytest.raises(Exception, match="prompt-tokens-p99"):
        lognormal_lengths(500, 400, 10, np.random.default_rng(0), "--prompt-tokens")


@settings(max_examples=120, deadline=None)
@given(n=st.integers(1, 40), blocks=st.integers(1, 300), block=st.sampled_from([1, 4, 16]),
       seqs=st.integers(1, 8), budget=st.integers(1, 512), chunked=st.booleans(),
       prefix=st.booleans(), seed=st.integers(0, 10_000))
def test_every_request_is_served_or_counted_and_the_pool_holds(n, blocks, block, seqs,
                                                              budget, chunked, prefix, seed):
    rng = np.random.default_rng(seed)
    req = reqs(np.sort(rng.uniform(0, 0.05, n)), rng.integers(1, 200, n),
               rng.integers(1, 50, n), rng.random(n) < 0.5)
    cfg = SchedulerConfig(num_blocks=blocks, block_size=block, max_num_seqs=seqs,
                          max_num_batched_tokens=budget, enable_chunked_prefill=chunked,
                          enable_prefix_caching=prefix, prefix_tokens=32,
                          prefix_hit_share=0.5)
    r = simulate_serving(req, cfg, FLAT)
    served = ~r.rejected
    assert np.isfinite(r.e2e_s[served]).all()  # every request finishes or is counted
    assert (r.generated[served] == req.output[served]).all()  # tokens made = tokens asked
    assert (r.kv_blocks <= blocks).all()
    assert (r.ttft_s[served] > 0).all()
    assert (r.e2e_s[served] >= r.ttft_s[served]).all()


def test_a_deployment_report_for_llama_8b_on_h100():
    from servelab.api import load
    from servelab.llm.pool import pool_spec

    s = load("seed", {"llm.model": "llama-3.1-8b", "llm.num_gpus": 1, "llm.tp": 1,
                      "llm.kv_dtype": "auto", "llm.weight_dtype": "auto", "llm.gpu": "H100-SXM",
                      "llm.gpu_memory_gb": None})
    rep = serve_llm(pool_spec(s), Workload(request_rate=5, num_requests=300,
                                           prompt_tokens=512, output_tokens=128))
    d = rep.to_dict()
    assert d["requests"]["served"] == 300
    # batch-1 decode is the weights read once: ~16 GB at 3.35 TB/s x 0.8 + 0.5 ms
    assert 5.0 < d["step_model"]["decode_step_ms_batch1"] < 8.0
    assert d["tpot_ms"]["p50"] >= d["step_model"]["decode_step_ms_batch1"]
    assert d["output_tokens_per_s"] == pytest.approx(5 * 128, rel=0.15)
    assert math.isfinite(d["cost_per_million_output_usd"])


# -- calibration against published vLLM measurements ------------------------------------
# Batch-1 decode is the weights read once per step, so the roofline's memory side and its
# stated efficiency (0.8 of peak HBM bandwidth) and step overhead (0.5 ms) are what these
# check. Each figure is a published measurement of vLLM serving Llama 3.1 8B Instruct in
# BF16/FP16 at one request at a time:
PUBLISHED_BATCH1_TPOT_MS = [
    # H100-80GB-HBM3 (SXM), vLLM 0.21.0, concurrency 1: TPOT p50 6.48 ms.
    # https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/ (captured 2026-05-16)
    ("H100-SXM", 6.48),
    # A100 40GB, vLLM 0.23.0, 1024 input / 128 output tokens, concurrency 1: "about 75
    # tokens/sec" of decode, i.e. 13.3 ms a token.
    # https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on
    ("A100-40GB", 1000 / 75),
]


@pytest.mark.parametrize(("gpu", "measured_ms"), PUBLISHED_BATCH1_TPOT_MS)
def test_roofline_batch1_decode_matches_published_vllm(gpu, measured_ms):
    from servelab.api import load
    from servelab.llm.pool import pool_spec

    s = load("seed", {"llm.model": "llama-3.1-8b", "llm.num_gpus": 1, "llm.tp": 1,
                      "llm.kv_dtype": "auto", "llm.weight_dtype": "auto", "llm.gpu": gpu})
    model = StepModel.roofline(pool_spec(s))
    # one decode token at a 1,024-token context: the weights plus that context's KV
    predicted = model.step_s(1, 1024.0, 1024.0) * 1e3
    assert predicted == pytest.approx(measured_ms, rel=0.10), (gpu, predicted)


@pytest.mark.parametrize("args", [
    ["--rate", "0"], ["--num-requests", "0"], ["--prompt-tokens", "0"],
    ["--output-tokens", "100", "--output-tokens-p99", "50"],
    ["--num-requests", "1000000", "--output-tokens", "1000"],  # past the total-token cap
    ["--replicas", "0"], ["--compute-efficiency", "2"], ["--arrival", "bursty"],
    ["--prefix-hit-share", "1.5"], ["--tp", "3", "--model", "llama-3.1-8b"],
])
def test_llm_simulate_mistakes_are_one_line(args):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "servelab", "llm", "simulate", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (1, 2), (args, r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_plan_finds_the_fewest_replicas_meeting_the_slos():
    from servelab.api import load
    from servelab.llm.pool import pool_spec
    from servelab.llm.serving import plan_llm

    s = load("seed", {"llm.model": "llama-3.1-8b", "llm.num_gpus": 1, "llm.tp": 1,
                      "llm.kv_dtype": "auto", "llm.weight_dtype": "auto", "llm.gpu": "H100-SXM"})
    spec = pool_spec(s)
    w = Workload(request_rate=30, num_requests=600, prompt_tokens=512, output_tokens=128)
    plan = plan_llm(spec, w, ttft_p99_ms=400, tpot_p99_ms=25, max_replicas=16)
    assert plan.replicas is not None
    # the same answer as trying every count from 1 up
    brute = next(r for r in range(1, 17)
                 if (rep := serve_llm(spec, w, replicas=r)).requests["rejected"] == 0
                 and rep.ttft_ms["p99"] <= 400 and rep.tpot_ms["p99"] <= 25)
    assert plan.replicas == brute
    assert plan.gpus == plan.replicas
    d = plan.to_dict()
    assert d["report"]["replicas"] == plan.replicas
    none = plan_llm(spec, w, ttft_p99_ms=0.001, tpot_p99_ms=0.001, max_replicas=4)
    assert none.replicas is None
    assert [r["replicas"] for r in none.search] == [1, 2, 4]
