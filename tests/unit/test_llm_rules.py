"""llama.cpp's server as servelab simulates it (llm/llama_cpp.py), by hand-worked cases,
and its ubatch split held to a token-by-token port of llama.cpp's own.

Step times here are a fixed profile: 1 ms a pass over the model (a ubatch) plus 0.01 ms
a prefill token, so each case's times can be worked out on paper."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.errors import InputError
from servelab.llm.llama_cpp import Seq, Ubatch, split_equal
from servelab.llm.rules import SchedulingRule, llama_cpp, simulate, vllm_v1
from servelab.llm.serving import ProfileStepModel, Requests

STEP = ProfileStepModel(base_ms=1.0, per_prefill_token_ms=0.01, per_decode_seq_ms=0.0,
                        per_kv_token_ms=0.0, rows=0, max_abs_error_pct=0.0, source="hand")


def run(arrival_s: list[float], prompt: list[int], output: list[int], *, slots: int = 2,
        ctx: int = 4096, n_batch: int = 2048, n_ubatch: int = 512,
        max_concurrency: int = 0):  # type: ignore[no-untyped-def]
    req = Requests(np.array(arrival_s, float), np.array(prompt), np.array(output),
                   np.zeros(len(prompt), bool))
    return simulate(req, llama_cpp(slots, ctx, n_batch, n_ubatch), STEP, max_concurrency)


def test_a_request_finding_every_slot_busy_waits_for_the_first_to_free() -> None:
    # two slots, three requests at 0: prompts of 100 tokens, 3 tokens out each.
    # r0 takes slot 1, r1 slot 0 (of never-used slots the highest id goes first)
    # step 1: both prompts, one ubatch of 200 tokens: 1 + 2 = 3 ms -> first tokens at 3
    # steps 2, 3: their decodes, one ubatch each, 1 ms -> both done at 5 ms
    # step 4: r2's prompt: 1 + 1 = 2 ms -> first token at 7 ms; steps 5, 6 -> done at 9 ms
    r = run([0, 0, 0], [100, 100, 100], [3, 3, 3])
    assert r.ttft_s * 1e3 == pytest.approx([3, 3, 7])
    assert r.e2e_s * 1e3 == pytest.approx([5, 5, 9])


def test_a_prompt_longer_than_n_batch_goes_on_in_the_next_step() -> None:
    # n_batch 64, prompt 100: 64 tokens (1.64 ms), then 36 (1.36 ms) -> first token at 3 ms
    r = run([0], [100], [2], n_batch=64)
    assert r.ttft_s[0] * 1e3 == pytest.approx(3.0)
    assert r.steps == 3


def test_a_prompt_longer_than_n_ubatch_is_two_passes_in_one_step() -> None:
    # n_ubatch 64, prompt 100: one step, ubatches of 64 and 36: 1.64 + 1.36 ms
    r = run([0], [100], [2], n_ubatch=64)
    assert r.ttft_s[0] * 1e3 == pytest.approx(3.0)
    assert r.steps == 2


def test_a_decode_and_a_prompt_on_slots_out_of_order_are_two_passes() -> None:
    # r0 (prompt 10) takes slot 1: 1.1 ms. r1 arrives at 1.5 ms, takes slot 0.
    # At 2.1 the batch is r0's last decode (slot 1), then r1's 50-token prompt (slot 0):
    # slot 0 does not follow slot 1, so two ubatches: 1 ms + 1.5 ms -> r0 done and r1's
    # first token at 4.6; r1's decode, 1 ms -> done at 5.6.
    r = run([0, 0.0015], [10, 50], [3, 2])
    assert r.ttft_s * 1e3 == pytest.approx([1.1, 4.6 - 1.5])
    assert r.e2e_s * 1e3 == pytest.approx([4.6, 5.6 - 1.5])
    assert r.steps == 4


def test_the_decode_steps_after_a_prompt_cost_what_the_profile_measured() -> None:
    """`after_prefill_ms`: the 1st, 2nd, ... step of decodes alone after a step with
    prompt tokens costs that much more; a step with prompt tokens starts the count again,
    and the steps past the list cost nothing more."""
    from dataclasses import replace

    slow = replace(STEP, after_prefill_ms=(2.0, 0.5))
    req = Requests(np.array([0.0, 0.0045]), np.array([10, 10]), np.array([5, 3]),
                   np.zeros(2, bool))
    r = simulate(req, llama_cpp(2, 4096), slow)
    # r0 (slot 1): prompt 1.1 ms; its decodes alone: 1 + 2 -> 4.1, 1 + 0.5 -> 5.6.
    # r1 arrives at 4.5 and takes slot 0; at 5.6 the batch is r0's decode (slot 1) then
    # r1's prompt (slot 0): two passes, 1 + 1.1 -> 7.7, r1's first token.
    # Decodes alone again, the count started over: r0 and r1 (slots 0, 1: one pass)
    # 1 + 2 -> 10.7, r0's fifth token; r1's third 1 + 0.5 -> 12.2
    assert r.e2e_s * 1e3 == pytest.approx([10.7, 12.2 - 4.5])
    assert r.ttft_s * 1e3 == pytest.approx([1.1, 7.7 - 4.5])
    # without the term r0 is done (1.1, then 4 ms of decodes) before r1 comes, and r1
    # runs alone on slot 0: 5.1 + 1.1 -> 6.2, then 7.2, 8.2
    plain = simulate(req, llama_cpp(2, 4096), STEP)
    assert plain.e2e_s * 1e3 == pytest.approx([5.1, 8.2 - 4.5])
    # vLLM's rule has no such term: the same model gives the same result as without it
    v = vllm_v1(1024, 16, 2, 2048)
    assert simulate(req, v, slow).e2e_s.tolist() == simulate(req, v, STEP).e2e_s.tolist()


def test_decodes_on_slots_with_a_gap_pay_a_pass_each_run() -> None:
    # four slots; r0, r1, r2 at 0 take slots 3, 2, 1; prompts of 10 tokens.
    # step 1: prompts on 1, 2, 3: one ubatch of 30 tokens, 1.3 ms
    # step 2: decodes on 1, 2, 3: one ubatch, 1 ms -> 2.3; r1 (2 tokens) is done
    # steps 3-5: decodes on 1 and 3: two ubatches, 2 ms each -> 4.3, 6.3, 8.3
    r = run([0, 0, 0], [10, 10, 10], [5, 2, 5], slots=4)
    assert r.e2e_s * 1e3 == pytest.approx([8.3, 2.3, 8.3])
    assert r.tpot_s[0] * 1e3 == pytest.approx((8.3 - 1.3) / 4)
    # the same requests under vLLM's rule: one pass a step whatever the slots
    req = Requests(np.zeros(3), np.array([10] * 3), np.array([5, 2, 5]), np.zeros(3, bool))
    v = simulate(req, vllm_v1(1024, 16, 4, 2048), STEP)
    assert v.e2e_s * 1e3 == pytest.approx([5.3, 2.3, 5.3])


def test_a_freed_slot_is_reused_least_recently_released_first() -> None:
    # three slots: r0 -> slot 2, r1 -> slot 1; prompts of 10 (one ubatch, 1.2 ms).
    # r0 ends at 2.2 (2 tokens, slot 2 released), r1 at 3.2 (3 tokens, slot 1).
    # At 5 ms r2 takes slot 0 (never used), r3 slot 2 (released before slot 1): their
    # prompts and decodes are two ubatches a step, 2.2 ms then 2 ms: done at 9.2.
    # (Slots 0 and 1, or 1 and 2, would be one ubatch a step: done at 7.2.)
    r = run([0, 0, 0.005, 0.005], [10, 10, 10, 10], [2, 3, 2, 2], slots=3)
    assert r.e2e_s * 1e3 == pytest.approx([2.2, 3.2, 4.2, 4.2])


def test_a_closed_loop_sends_when_a_client_frees() -> None:
    # one client: r1 is sent when r0 ends (at 1.1 + 1 = 2.1 ms)
    r = run([0, 0], [10, 10], [2, 2], max_concurrency=1)
    assert r.sent_s * 1e3 == pytest.approx([0, 2.1])
    assert r.e2e_s * 1e3 == pytest.approx([2.1, 2.1])


def test_nothing_is_preempted_and_a_request_over_its_slot_is_refused() -> None:
    r = run([0] * 8, [500] * 8, [200] * 8, slots=4, ctx=1024)
    assert r.preemptions.sum() == 0
    assert not r.rejected.any()
    r = run([0, 0], [1000, 10], [100, 2], slots=2, ctx=1024)
    assert r.rejected.tolist() == [True, False]
    assert np.isnan(r.ttft_s[0])


def test_rule_names_and_limits() -> None:
    assert SchedulingRule.parse("llama.cpp") is SchedulingRule.LLAMA_CPP
    with pytest.raises(InputError, match="--rule"):
        SchedulingRule.parse("tgi")
    with pytest.raises(InputError, match="slots"):
        llama_cpp(0, 1024)
    with pytest.raises(InputError, match="n_ubatch"):
        llama_cpp(64, 1024, n_ubatch=32)


# -- the ubatch split ---------------------------------------------------------------


def test_split_equal_by_hand() -> None:
    dec = [Seq(0, 1, 40, True, True), Seq(2, 1, 50, True, True)]
    prompt = Seq(1, 10, 0, False, True)
    # slots 0 and 1 a token each, slot 2's token, then the prompt's other 9 tokens
    u = split_equal([*dec, prompt], 512)
    assert [(x.tokens, x.prefill, x.decodes, x.kv_read, x.sampled) for x in u] == [
        (2, 1, 1, 40, 1), (1, 0, 1, 50, 1), (9, 9, 0, 1, 1)]
    four = [Seq(s, 1, 10, True, True) for s in range(4)]
    assert [x.tokens for x in split_equal(four, 512)] == [4]
    assert [x.tokens for x in split_equal([four[0], four[1], four[3]], 512)] == [2, 1]
    # two prompts on consecutive slots: the same count from each, the fewest left
    two = [Seq(0, 100, 0, False, True), Seq(1, 30, 0, False, True)]
    assert [(x.tokens, x.sampled) for x in split_equal(two, 512)] == [(60, 1), (70, 1)]
    # at most n_ubatch tokens a ubatch
    assert [x.tokens for x in split_equal([Seq(0, 1000, 0, False, True)], 512)] == [512, 488]
    big = [Seq(0, 400, 0, False, True), Seq(1, 400, 0, False, True)]
    assert [x.tokens for x in split_equal(big, 512)] == [512, 288]


def reference_split(batch: list[Seq], n_ubatch: int) -> list[list[tuple[int, int]]]:
    """llama_batch_allocr::split_equal(n_ubatch, sequential=true) (src/llama-batch.cpp,
    llama.cpp as vendored by llama-cpp-python 0.3.36), token by token, for a batch whose
    tokens each belong to one sequence: each ubatch as (slot, tokens taken) pairs."""
    tokens = [s.slot for s in batch for _ in range(s.new)]
    used = [False] * len(tokens)
    out = []
    while True:
        cur: list[int] = []
        last = -1
        for i, seq in enumerate(tokens):
            if used[i]:
                continue
            add = seq not in cur and (not cur or seq == last + 1)
            if add:
                cur.append(seq)
                last = seq
                if len(cur) > n_ubatch:
                    break
        if not cur:
            return out
        idx = {s: [i for i, t in enumerate(tokens) if t == s and not used[i]] for s in cur}
        taken = dict.fromkeys(cur, 0)
        while all(taken[s] < len(idx[s]) for s in cur):
            for s in cur:
                used[idx[s][taken[s]]] = True
                taken[s] += 1
            if (taken[cur[0]] + 1) * len(cur) > n_ubatch:
                break
        out.append([(s, taken[s]) for s in cur])


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[Seq], int]:
    slots = draw(st.integers(1, 8))
    n_ubatch = draw(st.integers(slots, 64))
    gen = sorted(draw(st.sets(st.integers(0, slots - 1))))
    pro = sorted(draw(st.sets(st.integers(0, slots - 1).filter(lambda s: s not in gen))))
    batch = [Seq(s, 1, draw(st.integers(0, 100)), True, True) for s in gen]
    batch += [Seq(s, draw(st.integers(1, 150)), draw(st.integers(0, 50)), False,
                  draw(st.booleans())) for s in pro]
    return batch, n_ubatch


@settings(max_examples=300, deadline=None)
@given(batches())
def test_split_equal_matches_llama_cpps_own_token_by_token(case: tuple[list[Seq], int]
                                                         ) -> None:
    batch, n_ubatch = case
    ours = split_equal(batch, n_ubatch)
    ref = reference_split(batch, n_ubatch)
    assert [u.tokens for u in ours] == [sum(t for _, t in r) for r in ref]
    decode = {s.slot for s in batch if s.decode}
    assert [u.decodes for u in ours] == [sum(s in decode for s, _ in r) for r in ref]
    assert sum(u.tokens for u in ours) == sum(s.new for s in batch)
    assert all(u.tokens <= n_ubatch for u in ours)
    assert sum(u.sampled for u in ours) == sum(s.decode or s.samples for s in batch)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.05), st.integers(1, 300), st.integers(1, 20)),
                min_size=1, max_size=12),
       st.integers(16, 600))
def test_one_slot_is_vllms_rule_with_one_sequence(reqs: list[tuple[float, int, int]],
                                                 n_batch: int) -> None:
    """With one slot (and ubatches as large as the batch) llama.cpp runs requests one at
    a time, each prompt in chunks of n_batch: vLLM's rule with max_num_seqs 1."""
    arr, prompt, output = (np.array(c) for c in zip(*reqs, strict=True))
    req = Requests(arr.astype(float), prompt, output, np.zeros(arr.size, bool))
    ll = simulate(req, llama_cpp(1, 400, n_batch, n_batch), STEP)
    fits = prompt + output <= 400
    v = simulate(Requests(req.arrival_s[fits], prompt[fits], output[fits],
                          req.prefix_hit[fits]), vllm_v1(25, 16, 1, n_batch), STEP)
    assert ll.rejected.tolist() == (~fits).tolist()
    np.testing.assert_allclose(ll.ttft_s[fits], v.ttft_s, atol=1e-12)
    np.testing.assert_allclose(ll.e2e_s[fits], v.e2e_s, atol=1e-12)
    assert ll.generated[fits].tolist() == output[fits].tolist()


def test_ubatch_is_what_the_step_model_prices() -> None:
    u = Ubatch(tokens=3, prefill=1, decodes=2, kv_read=20, attn=0.0, sampled=3)
    assert STEP.step_s(u.tokens, u.attn, u.kv_read, u.decodes, u.sampled) * 1e3 == \
        pytest.approx(1.01)


def test_llm_simulate_runs_llama_cpps_rule_from_the_scenario() -> None:
    """`llm simulate --scheduler llama.cpp` ([llm] scheduler, which validate's fitted
    scenario sets): with one slot and ubatches as large as the batch it is vLLM's rule
    with one sequence; with four slots and long prompts it is not (each 512-token
    ubatch reads the weights again)."""
    import json
    import subprocess
    import sys

    def sim(*flags: str) -> dict:  # type: ignore[type-arg]
        done = subprocess.run([sys.executable, "-m", "servelab", "llm", "simulate",
                               "--prompt-tokens", "300", "--output-tokens", "20",
                               "--request-rate", "2", "--num-requests", "100", "--json",
                               *flags], capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    one = ("--max-num-seqs", "1", "--max-num-batched-tokens", "512")
    v1, ll = sim("--scheduler", "v1", *one), sim("--scheduler", "llama.cpp", *one)
    assert ll["ttft_ms"] == v1["ttft_ms"]
    assert ll["tpot_ms"] == v1["tpot_ms"]
    four = ("--max-num-seqs", "4", "--prompt-tokens", "2000")
    assert sim("--scheduler", "llama.cpp", *four)["ttft_ms"]["p50"] > \
        sim("--scheduler", "v1", *four)["ttft_ms"]["p50"]
