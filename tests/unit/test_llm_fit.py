"""The step model's newer terms, the prefill-first step loop, gamma arrivals, and
`llm fit`: hand-worked cases, a known model recovered from the simulator's own
`--save-result` files, and bad result files as one-line errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.errors import InputError
from servelab.llm.fit import default_names, fit, predict, run_from_vllm_result, vllm_result
from servelab.llm.serving import (
    SchedulerConfig,
    StepModel,
    StepParams,
    Workload,
    serve_llm,
    simulate_serving,
)
from tests.unit.test_llm_serving import FLAT, reqs  # 1 ms of weights, 0.01 ms a token


def _spec(model: str = "llama-3.1-8b", gpu: str = "A100-80GB", tp: int = 1):  # type: ignore[no-untyped-def]
    from servelab.api import load
    from servelab.llm.pool import pool_spec

    return pool_spec(load("seed", {"llm.model": model, "llm.num_gpus": tp, "llm.tp": tp,
                                   "llm.kv_dtype": "auto", "llm.weight_dtype": "auto",
                                   "llm.gpu": gpu}))


# -- the step model --------------------------------------------------------------------
def test_overlap_is_a_p_norm_of_the_two_sides_hand_worked():
    """A 300-token step under FLAT: compute 3 ms, memory 1 ms. max() gives 3 ms; p = 2
    gives sqrt(9 + 1); p = 1 the sum, 4 ms."""
    from dataclasses import replace

    assert FLAT.step_s(300, 0.0, 0.0) * 1e3 == pytest.approx(3.0)
    assert replace(FLAT, overlap=2.0).step_s(300, 0.0, 0.0) * 1e3 == pytest.approx(
        math.sqrt(10))
    assert replace(FLAT, overlap=1.0).step_s(300, 0.0, 0.0) * 1e3 == pytest.approx(4.0)


def test_per_sequence_time_and_the_lm_head_count_the_sampled_sequences():
    from dataclasses import replace

    m = replace(FLAT, per_seq_s=0.0001, lm_head_flops=1e11)  # 0.1 ms of LM head each
    # 5 decodes: 5 tokens of GEMMs (0.05 ms) + 5 LM heads (0.5 ms) < 1 ms of weights;
    # then 5 x 0.1 ms a sequence
    assert m.step_s(5, 0.0, 0.0, decode_seqs=5) * 1e3 == pytest.approx(1.0 + 0.5)
    # a 500-token prompt's last chunk with 2 decodes: 3 sequences sample; compute
    # 502 x 0.01 + 3 x 0.1 = 5.32 ms
    assert m.step_s(502, 0.0, 0.0, decode_seqs=2, seqs=3) * 1e3 == pytest.approx(
        5.32 + 0.3)


def test_roofline_leaves_the_embedding_out_and_runs_the_lm_head_per_sampled_token():
    """Llama 3.1 8B: 128,256 x 4,096 embedding and LM head, 8.03B parameters."""
    from servelab.llm.models import get_model

    m = get_model("llama-3.1-8b")
    step = StepModel.roofline(_spec())
    head = 128_256 * 4_096
    assert step.flops_per_token == pytest.approx(2 * (m.num_parameters - 2 * head))
    assert step.lm_head_flops == pytest.approx(2 * head)


def test_frontend_time_adds_to_ttft_and_end_to_end_only():
    w = Workload(request_rate=2, num_requests=50, prompt_tokens=200, output_tokens=20)
    a = serve_llm(_spec(), w, step_params=StepParams(frontend_ms=0.0))
    b = serve_llm(_spec(), w, step_params=StepParams(frontend_ms=7.0))
    for q in ("p50", "p99"):
        assert b.ttft_ms[q] - a.ttft_ms[q] == pytest.approx(7.0)
        assert b.e2e_ms[q] - a.e2e_ms[q] == pytest.approx(7.0)
        assert b.tpot_ms[q] == pytest.approx(a.tpot_ms[q])


# -- the prefill-first step loop -------------------------------------------------------
def test_prefill_first_runs_a_new_prompt_alone_while_decodes_wait():
    """A decoding request (500-token prompt, 4 outputs) and a 300-token prompt arriving
    at 5.5 ms. Mixed (v1): step 3 carries the decode and the prompt (3.01 ms).
    Prefill-first: step 3 is the prompt alone (3 ms), the decode resumes after it."""
    r = reqs([0.0, 0.0055], [500, 300], [4, 2])
    mixed = simulate_serving(r, SchedulerConfig(num_blocks=1000), FLAT)
    first = simulate_serving(r, SchedulerConfig(num_blocks=1000, prefill_first=True,
                                                enable_chunked_prefill=False), FLAT)
    # request 0: prefill 5 ms, a decode at 6 ms; then the second prompt arrives
    assert mixed.ttft_s[1] * 1e3 == pytest.approx(6.0 + 3.01 - 5.5)
    assert first.ttft_s[1] * 1e3 == pytest.approx(6.0 + 3.0 - 5.5)
    # request 0 has two decodes left at 6 ms. Mixed: one rides in step 3 (3.01 ms), the
    # last in step 4 (1 ms). Prefill-first: step 3 is the prompt alone, so both follow it
    assert mixed.e2e_s[0] * 1e3 == pytest.approx(5.0 + 1.0 + 3.01 + 1.0)
    assert first.e2e_s[0] * 1e3 == pytest.approx(5.0 + 1.0 + 3.0 + 1.0 + 1.0)
    assert (mixed.steps, first.steps) == (4, 5)


def test_prefill_first_admits_whole_prompts_only_and_rejects_one_past_the_budget():
    cfg = SchedulerConfig(num_blocks=1000, max_num_batched_tokens=512, prefill_first=True,
                          enable_chunked_prefill=False)
    r = simulate_serving(reqs([0.0, 0.0, 0.0], [400, 300, 600], [2, 2, 2]), cfg, FLAT)
    assert bool(r.rejected[2])  # 600 > 512: never schedulable whole
    # 400 alone (300 does not fit the rest), then 300 alone: a prefill-only step each
    assert r.ttft_s[0] * 1e3 == pytest.approx(4.0)
    assert r.ttft_s[1] * 1e3 == pytest.approx(4.0 + 3.0)


# -- arrivals ----------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [0.25, 1.0, 4.0])
def test_burstiness_is_a_gamma_shape_with_the_same_mean_rate(shape):
    w = Workload(request_rate=10.0, num_requests=200_000, prompt_tokens=8, output_tokens=8,
                 burstiness=shape)
    gaps = np.diff(w.draw().arrival_s)
    assert gaps.mean() == pytest.approx(0.1, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(shape), rel=0.03)


# -- llm fit ----------------------------------------------------------------------------
KNOWN = StepParams(compute_efficiency=0.55, memory_efficiency=0.7, overhead_ms=1.0,
                   per_seq_ms=0.05, frontend_ms=5.0)
LOADS = [  # (rate, concurrency, prompt, output, requests): rates, a closed loop, long prompts
    (2.0, 0, 256, 128, 200), (10.0, 0, 256, 128, 300), (1.0, 0, 2048, 128, 120),
    (math.inf, 64, 256, 128, 320)]


def _known_runs(tmp: Path, params: StepParams, loads=LOADS):  # type: ignore[no-untyped-def]
    spec = _spec()
    runs = []
    for k, (rate, conc, p, o, n) in enumerate(loads):
        w = Workload(request_rate=rate, num_requests=n, prompt_tokens=p, output_tokens=o,
                     max_concurrency=conc, seed=k)
        rep = serve_llm(spec, w, step_params=params)
        path = tmp / f"run-{k}.json"
        path.write_text(json.dumps(vllm_result(rep, w)))
        runs.append(run_from_vllm_result(path, spec, seed=k))
    return runs


def test_a_save_result_file_replays_to_the_same_figures(tmp_path):
    """What `llm simulate --save-result` writes, read back, simulates to the same
    figures: the file carries each request's lengths and the load."""
    for run in _known_runs(tmp_path, KNOWN):
        pred = predict(run, KNOWN)
        for fig, v in run.measured.items():
            assert pred[fig] == pytest.approx(v, rel=1e-9), (run.label, fig)


def test_fit_recovers_a_known_step_model_from_its_own_result_files(tmp_path):
    """Runs at two rates, a closed loop and long prompts, written by the simulator with
    known constants; the fit starts from the defaults and must reproduce every figure,
    and a load between them it was not given (6/s, 512-token prompts), within 2%."""
    runs = _known_runs(tmp_path, KNOWN)
    res = fit(runs, max_evals=350)
    for run in runs:
        pred = predict(run, res.params)
        for fig, v in run.measured.items():
            assert pred[fig] == pytest.approx(v, rel=0.02), (run.label, fig, res.params)
    (tmp_path / "held").mkdir()
    held = _known_runs(tmp_path / "held", KNOWN, [(6.0, 0, 512, 128, 200)])[0]
    pred = predict(held, res.params)
    for fig, v in held.measured.items():
        assert pred[fig] == pytest.approx(v, rel=0.02), (fig, res.params)


@settings(max_examples=60, deadline=None)
@given(st.one_of(
    st.none(), st.integers(), st.text(max_size=20), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.sampled_from(["completed", "request_rate", "median_ttft_ms",
                                     "median_tpot_ms", "output_throughput", "input_lens",
                                     "output_lens", "burstiness", "max_concurrency",
                                     "total_input_tokens", "total_output_tokens"]),
                    st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True),
                              st.integers(-5, 10**13), st.text(max_size=5),
                              st.lists(st.integers(-3, 10**9), max_size=4)),
                    max_size=11)))
def test_any_result_file_is_read_or_refused_in_one_line(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("r") / "r.json"
    path.write_text(json.dumps(doc))
    try:
        run = run_from_vllm_result(path, _spec())
    except InputError as e:
        message = str(e)
        assert "\n" not in message
    else:
        assert run.measured
        assert run.workload.num_requests >= 1


def test_llm_fit_cli_names_a_broken_file_in_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"completed": 10, "request_rate": "fast"}')
    for args in (["llm", "fit", str(bad)], ["llm", "fit", str(tmp_path / "none.json")],
                 ["llm", "simulate", "--burstiness", "0"],
                 ["llm", "simulate", "--num-requests", "20", "--save-result",
                  str(tmp_path / "no" / "such" / "dir.json")],
                 ["llm", "simulate", "--scheduler", "v0"]):
        p = subprocess.run([sys.executable, "-m", "servelab", *args], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode in (1, 2), (args, p.stderr)  # 1: bad value, 2: usage
        assert "Traceback" not in p.stderr, args
        assert len(p.stderr.strip().splitlines()) == 1, (args, p.stderr)


def test_hardware_overrides_reach_the_llm_deployment():
    """[hardware] figure overrides apply to [llm] when both name the same GPU: halving the
    H100's bandwidth doubles a batch-1 decode's weight read."""
    from servelab.api import load
    from servelab.llm.pool import pool_spec

    base = {"llm.model": "llama-3.1-8b", "llm.num_gpus": 1, "llm.tp": 1, "llm.gpu": None,
            "hardware.gpu": "H100-SXM"}
    plain = pool_spec(load("seed", base))
    slow = pool_spec(load("seed", {**base, "hardware.hbm_bandwidth_tbps": 1.675,
                                   "hardware.interconnect_gbps": 64}))
    assert slow.gpu.hbm_bandwidth_tbps == pytest.approx(plain.gpu.hbm_bandwidth_tbps / 2)
    assert slow.gpu.interconnect_gbps == 64
    exact = StepParams(overlap=math.inf)  # the larger side alone: the weights' read
    a, b = StepModel.roofline(plain, exact), StepModel.roofline(slow, exact)
    read = a.weight_bytes / (a.hbm_bytes_per_s * a.memory_efficiency)
    assert b.step_s(1, 0.0, 0.0, 1) - a.step_s(1, 0.0, 0.0, 1) == pytest.approx(read, rel=1e-6)
    # a different [llm] gpu takes its own catalog figures
    other = pool_spec(load("seed", {**base, "llm.gpu": "A100-80GB",
                                    "hardware.hbm_bandwidth_tbps": 1.675}))
    assert other.gpu.hbm_bandwidth_tbps == pytest.approx(2.039)


def test_goodput_counts_requests_meeting_every_slo_as_vllm_does():
    from servelab.llm.serving import request_goodput

    per = {"ttft_s": np.array([0.1, 0.3, 0.1, np.nan]),
           "tpot_s": np.array([0.02, 0.02, np.nan, np.nan]),  # a one-token answer: TPOT 0
           "e2e_s": np.array([1.0, 1.0, 0.1, np.nan]), "duration_s": 2.0}
    assert request_goodput(per, {"ttft": 200}) == pytest.approx(2 / 2.0)
    assert request_goodput(per, {"ttft": 200, "tpot": 10}) == pytest.approx(1 / 2.0)
    assert request_goodput(per, {"e2el": 500}) == pytest.approx(1 / 2.0)
    assert request_goodput(per, {"ttft": 1000, "tpot": 30}) == pytest.approx(3 / 2.0)


def test_llm_fit_frees_the_all_reduce_latency_the_runs_gpus_use():
    """One GPU: no all-reduce to fit. tp 2 on PCIe, or any tp on NVLink: vLLM's own
    kernel's latency. tp 4 on PCIe: NCCL's (vLLM turns its kernel off there)."""
    from servelab.llm.fit import Run
    from servelab.llm.serving import Workload
    from tests.unit.test_llm_serving import _spec

    def run(tp: int, gpu: str, prefill_first: bool = False) -> Run:
        return Run("r", _spec("llama-3.1-70b", tp, gpu), Workload(request_rate=1.0),
                   prefill_first,
                   {"tpot_p50_ms": 10.0})

    base = ["compute_efficiency", "memory_efficiency", "overhead_ms", "per_seq_ms",
            "frontend_ms"]
    assert default_names([run(1, "A100-PCIe")]) == base
    assert default_names([run(2, "A100-PCIe")]) == [*base, "allreduce_latency_us"]
    assert default_names([run(4, "A100-80GB")]) == [*base, "allreduce_latency_us"]
    assert default_names([run(4, "A100-PCIe")]) == [*base, "nccl_allreduce_latency_us"]
    assert default_names([run(2, "A100-PCIe"), run(4, "A100-PCIe")]) == [
        *base, "allreduce_latency_us", "nccl_allreduce_latency_us"]
    assert default_names([run(1, "H100-SXM", prefill_first=True)])[2] == (
        "prefill_first_overhead_ms")
