"""The llama.cpp server's scheduling rule, by hand-worked cases (llm/rules.py).

Step times here are a fixed profile: 1 ms a step plus 0.01 ms a prefill token, so each
case's times can be worked out on paper."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.errors import InputError
from servelab.llm.rules import SchedulingRule, llama_cpp
from servelab.llm.serving import ProfileStepModel, Requests, simulate_serving

STEP = ProfileStepModel(base_ms=1.0, per_prefill_token_ms=0.01, per_decode_seq_ms=0.0,
                        per_kv_token_ms=0.0, rows=0, max_abs_error_pct=0.0, source="hand")


def run(arrival_s: list[float], prompt: list[int], output: list[int], *, slots: int = 2,
        ctx: int = 4096, n_batch: int = 2048):  # type: ignore[no-untyped-def]
    req = Requests(np.array(arrival_s), np.array(prompt), np.array(output),
                   np.zeros(len(prompt), bool))
    return simulate_serving(req, llama_cpp(slots, ctx, n_batch), STEP)


def test_a_request_finding_every_slot_busy_waits_for_the_first_to_free() -> None:
    # two slots, three requests at 0: prompts of 100 tokens, 3 tokens out each.
    # step 1: both prompts (200 tokens): 1 + 2 = 3 ms -> first tokens of r0, r1 at 3 ms
    # steps 2, 3: their decodes, 1 ms each -> both done at 5 ms
    # step 4: r2's prompt: 1 + 1 = 2 ms -> first token at 7 ms; steps 5, 6 -> done at 9 ms
    r = run([0, 0, 0], [100, 100, 100], [3, 3, 3])
    assert r.ttft_s * 1e3 == pytest.approx([3, 3, 7])
    assert r.e2e_s * 1e3 == pytest.approx([5, 5, 9])


def test_a_prompt_longer_than_n_batch_goes_on_in_the_next_step() -> None:
    # n_batch 64, prompt 100: 64 tokens (1.64 ms), then 36 (1.36 ms) -> first token at 3 ms
    r = run([0], [100], [2], n_batch=64)
    assert r.ttft_s[0] * 1e3 == pytest.approx(3.0)
    assert r.steps == 3


def test_decodes_share_a_step_with_another_slots_prompt() -> None:
    # r0 alone: prompt 10 -> 1.1 ms; r1 arrives at 1.5 ms, during r0's first decode step
    # (1.1 -> 2.1); at 2.1 one step holds r0's decode and r1's 50-token prompt: 1.5 ms
    r = run([0, 0.0015], [10, 50], [3, 2])
    assert r.ttft_s[1] * 1e3 == pytest.approx(2.1 + 1.5 - 1.5)
    assert r.e2e_s[0] * 1e3 == pytest.approx(1.1 + 1.0 + 1.5)


def test_nothing_is_preempted_while_requests_fit_their_slot() -> None:
    r = run([0] * 8, [500] * 8, [200] * 8, slots=4, ctx=1024)
    assert r.preemptions.sum() == 0
    assert not r.rejected.any()


def test_rule_names() -> None:
    assert SchedulingRule.parse("llama.cpp") is SchedulingRule.LLAMA_CPP
    with pytest.raises(InputError, match="--rule"):
        SchedulingRule.parse("tgi")
    with pytest.raises(InputError, match="slots"):
        llama_cpp(0, 1024)
