"""The LLM simulator held to published serving measurements (servelab/data/
published_llm.toml, every case with its source): the step model's default constants were
fitted on the cases marked "fit" (bench/fit_published_llm.py); these tests hold the
"hold-out" ones, which the fit never saw, and check the case file itself."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from servelab.llm.published import cases, compare, to_run
from servelab.llm.serving import StepParams

HOLD_OUT_BOUND = 0.15  # the bar: medians and saturated throughput within 15%
# Hold-out figures that miss the bar today, with the bound they do hold and why; the
# table in docs/llm.md shows them too. Empty means every hold-out figure meets 15%.
KNOWN_MISSES: dict[tuple[str, str], float] = {
    # Since the joint refit of 2026-12-06 (Lambda's ten-prompt H100 runs in the fit;
    # docs/llm.md). One frontend_ms for every engine: vLLM 0.6.0's ten-prompt runs on
    # Lambda's H100 host want 16 ms outside the steps, SGLang's server on its own host
    # less than half that, so SGLang's TTFT on 8B comes out long (the 4/s figure is a fit
    # figure: FIT_MISSES).
    ("sglang-8b-a100-r8", "ttft_p50_ms"): 0.30,
    # A small prompt rides inside a 70B decode step under max(compute, memory): SGLang's
    # TPOT at 8/s, vLLM 0.6.0's TTFT at 4 and 8/s and the pipeline-parallel 4/s TPOT come
    # out short (its TPOT grew 46% from 1/s to 4/s, the model's 15%). A p-norm in place of
    # the max, fitted beside the rest, went to p = 4 and fitted worse.
    ("sglang-70b-h100tp4-r8", "tpot_p50_ms"): 0.25,
    ("vllm060-70b-h100tp4-r4", "ttft_p50_ms"): 0.25,
    ("vllm060-70b-h100tp4-r8", "ttft_p50_ms"): 0.30,
    ("vllm-70b-a100-40-tp4pp2-r4", "tpot_p50_ms"): 0.25,
    # Mixtral 8x7B, ten prompts at once over two A100s: the first tokens came 1.71 s after
    # the send, 11 times the model's TTFT (152 ms with the prefill of the 1,585 tokens);
    # its decode steps (TPOT -3%) fit. The cause is not known (the MoE kernels' first use
    # at that shape would be one).
    ("mixtral-a100-tp2-10", "ttft_p50_ms"): 0.95,
    # FP8 checkpoints: on an H100 the measured TTFT is the BF16 runs' (62.5 against 62.2
    # ms on 8B, which comes out -13.7% since the refit of 2026-12-07), where the model
    # runs the prefill at the FP8 peak, twice BF16's
    ("vllm060-70b-fp8-h100-tp1-10", "ttft_p50_ms"): 0.35,
    # and the 70B's ten decodes: the model reads the FP8 weights at the BF16 ones'
    # efficiency, the measured step is 19% longer (-14.8% until the refit of 2026-12-07,
    # whose step overhead for vLLM 0.6.0 and SGLang fell from 1.98 to 1.68 ms)
    ("vllm060-70b-fp8-h100-tp1-10", "tpot_p50_ms"): 0.20,
    # and on an A100 (FP8 weights, BF16 compute through Marlin) the ramp's compute for a
    # decode step of ten binds where the halved weights no longer do: TPOT +36%
    ("vllm060-8b-fp8-a100-tp1-10", "tpot_p50_ms"): 0.45,
}
# Fit figures the fit leaves more than 15% off, and the bound each holds (why: above)
FIT_MISSES: dict[tuple[str, str], float] = {
    ("sglang-8b-a100-r4", "ttft_p50_ms"): 0.30,
    # SGLang's 5,000 prompts at once on 70B over four H100s, at its own batch (about 850
    # running, since 2026-12-07): the model's step at that batch is short. vLLM's 256 on
    # the same GPUs comes out +12%, and 850 on one A100 (8B) +1.6%
    ("sglang-70b-h100tp4-inf", "output_tokens_per_s"): 0.25,
}


@pytest.fixture(scope="module")
def rows():  # type: ignore[no-untyped-def]
    return compare(StepParams())


def test_every_case_names_its_source_engine_and_use():
    seen = set()
    for c in cases():
        assert c.id not in seen
        seen.add(c.id)
        assert c.source, c.id
        assert c.engine, c.id
        assert c.use in ("fit", "hold-out"), c.id
        assert c.scheduler in ("v1", "prefill-first", "sglang"), c.id
        assert c.figures() or c.not_modelled, c.id
        for fig in c.not_modelled:
            assert fig in c.measured, (c.id, fig)
        for fig, why in c.not_fitted.items():
            assert fig in c.measured, (c.id, fig)
            assert why, (c.id, fig)
            assert c.use == "fit", c.id  # a hold-out case's figures are all held out
    uses = {c.use for c in cases()}
    assert uses == {"fit", "hold-out"}


def test_the_sharegpt_sample_is_the_one_described():
    """303 rows of vLLM benchmark_serving's ShareGPT sample (Llama 3 tokenizer): the
    source file's totals less the 17 requests recorded with 0 output tokens."""
    c = next(c for c in cases() if c.lengths is not None)
    assert c.lengths is not None
    prompt, output = c.lengths
    assert prompt.size == output.size == 303
    assert int(prompt.sum()) == 58_753
    assert int(output.sum()) == 65_331
    assert prompt.max() <= 1024
    assert (prompt + output).max() <= 2048
    assert (prompt >= 1).all()
    assert (output >= 1).all()


def test_hold_out_cases_within_fifteen_percent(rows):  # type: ignore[no-untyped-def]
    misses = []
    for r in rows:
        if r.use != "hold-out" or not r.modelled:
            continue
        bound = KNOWN_MISSES.get((r.case.id, r.figure), HOLD_OUT_BOUND)
        if abs(r.error) > bound:
            misses.append(f"{r.case.id} {r.figure}: measured {r.measured:g}, predicted "
                          f"{r.predicted:.4g} ({r.error:+.1%}, bound {bound:.0%})")
    assert not misses, "\n".join(misses)


def test_fit_cases_are_reproduced(rows):  # type: ignore[no-untyped-def]
    """The fit's own cases: a fit that leaves one far off is a model that cannot say it."""
    for r in rows:
        if r.use == "fit" and r.modelled:
            bound = FIT_MISSES.get((r.case.id, r.figure), HOLD_OUT_BOUND)
            assert abs(r.error) <= bound, (r.case.id, r.figure, r.error)


def test_every_configuration_is_covered_by_a_hold_out(rows):  # type: ignore[no-untyped-def]
    held = {(r.case.model, r.case.gpu, r.case.tp) for r in rows
            if r.use == "hold-out" and r.modelled}
    assert ("llama-3.1-8b", "A100-80GB", 1) in held
    assert ("llama-3.1-70b", "H100-SXM", 4) in held
    assert ("llama-3.1-8b", "A100-40GB", 1) in held  # vLLM V1's closed loop
    assert ("llama-3.1-70b", "A100-PCIe", 4) in held  # through NCCL (PCIe)
    assert ("llama-3.1-8b", "A100-80GB", 2) in held  # tensor parallel 2 (NVLink)
    assert ("llama-3.1-70b", "A100-40GB", 4) in held  # tp 4 x pipeline parallel 2
    # tp 2's TTFT and TPOT, ten prompts at once (the H100 ones are "fit" cases since the
    # 2026-12-06 refit): 8B, 70B and Mistral 7B on A100, and a mixture of experts
    assert ("llama-3-70b", "A100-80GB", 2) in held
    assert ("mistral-7b-v0.3", "A100-80GB", 2) in held
    assert ("mixtral-8x7b", "A100-80GB", 2) in held
    assert ("llama-3.1-70b", "H100-SXM", 1) in held  # an FP8 checkpoint on one H100


def test_a_case_runs_as_its_source_ran_it():
    c = next(c for c in cases() if c.id == "sglang-8b-a100-r8")
    run = to_run(c)
    assert run.prefill_first
    assert run.workload.request_rate == 8
    assert run.workload.num_requests == 2400
    assert run.workload.lengths is not None
    assert run.spec.gpu.key == "A100-80GB"
    assert run.spec.max_num_batched_tokens == 8192
    assert math.isclose(np.mean(run.workload.lengths[1]), 216, rel_tol=0.1)


def test_a_case_that_lists_its_requests_runs_them_as_they_are():
    """Lambda's ten-prompt runs list each request's prompt and output tokens: one run of
    those, in order, a recorded 0 as a one-token answer, not draws from the sample."""
    from servelab.llm.published import draws

    c = next(c for c in cases() if c.id == "vllm060-70b-h100-tp2-10")
    assert draws(c) == 1
    w = to_run(c).workload
    assert w.lengths is not None
    assert w.lengths[0].tolist() == [13, 25, 27, 10, 329, 29, 399, 328, 4, 205]
    assert w.lengths[1].tolist() == [120, 661, 233, 194, 101, 741, 1, 1, 6, 35]
    assert to_run(c, 5).workload.lengths[1].tolist() == w.lengths[1].tolist()


def test_an_fp8_checkpoint_runs_with_fp8_weights():
    """Neural Magic's FP8 checkpoints: the case's weight_dtype reaches the deployment, so
    its weights are half the bytes and, on an H100, its GEMMs run at the FP8 peak."""
    from servelab.llm.serving import StepModel

    by_id = {c.id: c for c in cases()}
    fp8, bf16 = (to_run(by_id[i]).spec for i in ("vllm060-8b-fp8-h100-tp1-10",
                                                 "vllm060-8b-h100-tp1-10"))
    assert (fp8.weight_dtype, bf16.weight_dtype) == ("fp8", "auto")
    a, b = StepModel.roofline(fp8), StepModel.roofline(bf16)
    assert a.weight_bytes == pytest.approx(b.weight_bytes / 2, rel=0.01)
    assert a.peak_flops == pytest.approx(2 * b.peak_flops, rel=0.01)


def test_a_draw_is_held_to_the_runs_stated_mean_lengths():
    """The A100 PCIe runs' source gives their 200 prompts' mean prompt and output tokens
    (213.3 and 213.5-213.9); every draw of those cases is within 2% of both, the same
    seed gives the same draw, and the 1/s and 4/s runs (the same prompts) draw alike."""
    from servelab.llm.published import MEAN_TOLERANCE

    by_id = {c.id: c for c in cases()}
    r1, r4 = by_id["vllm-70b-a100pcie-tp4-r1"], by_id["vllm-70b-a100pcie-tp4-r4"]
    assert r1.mean_lengths == (213.29, 213.92)
    assert r4.mean_lengths == (213.29, 213.54)
    for seed in range(6):
        w = to_run(r1, seed).workload
        assert w.lengths is not None
        prompt, output = w.lengths
        assert prompt.size == output.size == 200
        assert abs(prompt.mean() / 213.29 - 1) <= MEAN_TOLERANCE
        assert abs(output.mean() / 213.92 - 1) <= MEAN_TOLERANCE
        again = to_run(r1, seed).workload.lengths
        assert again is not None
        assert (again[0] == prompt).all()
        other = to_run(r4, seed).workload.lengths
        assert other is not None
        assert (other[0] == prompt).all()
    # the sample's own means are 194 and 216: an unheld draw is seldom within 2% of 213
    free = dataclasses.replace(r1, mean_lengths=None)
    near = 0
    for seed in range(40):
        w = to_run(free, seed).workload
        assert w.lengths is not None
        near += abs(w.lengths[0].mean() / 213.29 - 1) <= MEAN_TOLERANCE
    assert near < 20


def test_means_no_draw_can_reach_are_a_clear_error():
    c = dataclasses.replace(next(c for c in cases() if c.mean_lengths is not None),
                            mean_lengths=(5000.0, 10.0))
    with pytest.raises(ValueError, match=r"no draw of 200 requests .* mean lengths"):
        to_run(c)


def test_llm_fit_predicts_a_held_out_published_rate_from_the_others():
    """`llm fit` as a user would run it on their own runs: SGLang's Llama 3.1 8B on one
    A100 at 4 requests/s and at saturation, starting from the roofline's constants before
    any fit (GEMM efficiencies 0.7/0.8, 0.5 ms a step, nothing per sequence or outside
    the steps); the fitted model then predicts 8 requests/s, which it never saw."""
    from servelab.llm.fit import fit, predict

    by_id = {c.id: c for c in cases()}
    runs = [to_run(by_id[i]) for i in ("sglang-8b-a100-r4", "sglang-8b-a100-inf")]
    start = StepParams(compute_efficiency=0.7, memory_efficiency=0.8,
                       prefill_first_overhead_ms=0.5, per_seq_ms=0.0, frontend_ms=0.0,
                       intake_ms=0.0, intake_per_token_us=0.0, compute_ramp_tokens=0.0)
    res = fit(runs, start, max_evals=80)
    held = to_run(by_id["sglang-8b-a100-r8"])
    pred = predict(held, res.params)
    for fig, v in held.measured.items():
        assert pred[fig] == pytest.approx(v, rel=HOLD_OUT_BOUND), (fig, pred[fig], v,
                                                                    res.params)


def test_the_table_in_the_docs_is_the_one_the_model_gives(rows):  # type: ignore[no-untyped-def]
    """docs/llm.md's table of every case, as `servelab llm published` prints it: each
    figure's error there is the error the model gives now (a changed model must update
    the table, and the README's copy of it)."""
    from pathlib import Path

    kinds = (("TTFT", "ttft_p50_ms"), ("TPOT", "tpot_p50_ms"),
             ("output tokens/s", "output_tokens_per_s"),
             ("tokens/s gain", "output_tokens_per_s_gain"))
    text = (Path(__file__).resolve().parents[2] / "docs" / "llm.md").read_text("utf-8")
    documented = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7 or cells[2] not in ("fit", "hold-out"):
            continue
        figure = next(f for label, f in kinds if cells[3].startswith(label))
        documented[(cells[0], figure)] = cells[6].split()[0].replace("−", "-")
    now = {(r.case.id, r.figure): f"{r.error * 100:+.1f}%" for r in rows}
    assert documented == now
