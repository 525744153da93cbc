"""An event loop that parses new requests and writes the answers ([latency]
frontend_answer_ms), run with the batcher turn by turn (batching/answering.py).

Held to a reference written plainly here: the loop's turns on a given list of batch
ends, and the batcher on the loop's hand-overs, gone round until neither changes (a
fixed point, which every run of the turn-by-turn simulation must be), and to one case
worked by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.api import run_simulate
from servelab.batching.answering import answering_run
from servelab.batching.simulate import simulate, simulate_policy
from servelab.errors import InputError
from servelab.scenario import BatchingPolicy, load_scenario


def loop_turns(sent: list[int], batches: list[tuple[int, int, int]], cost: int, turn: int,
               answer: int) -> tuple[list[int], dict[int, int]]:
    """The loop on known batch ends, written plainly: (each request's hand-over, each
    batch's first answer's start). `batches` holds (end, batch number, size)."""
    todo = sorted(batches)
    out: list[int] = []
    answers_from: dict[int, int] = {}
    free, i = 0, 0
    while i < len(sent) or todo:
        waiting = ([sent[i]] if i < len(sent) else []) + [e for e, _, _ in todo[:1]]
        start = max(min(waiting), free)
        t = start + turn
        while todo and todo[0][0] <= start:
            _, b, size = todo.pop(0)
            answers_from[b] = t
            t += size * answer
        took = [a for a in sent[i:] if a <= start]
        free = t + len(took) * cost
        out += [free] * len(took)
        i += len(took)
    return out, answers_from


def fixed_point(sent: list[int], exec_ns: np.ndarray, policy: BatchingPolicy, instances: int,
                cost: int, turn: int, answer: int):
    """The loop on the last round's batches, the batcher on the loop's hand-overs, again
    until the hand-overs repeat (each round fixes at least one more turn in time order,
    so at most one round a request)."""
    at, _ = loop_turns(sent, [], cost, turn, answer)
    for _ in range(2 * len(sent) + 2):
        rec = simulate_policy(np.asarray(at, np.int64), exec_ns, np.ones(1), policy, instances)
        batches = [(int(e), b, int(s)) for b, (e, s) in
                   enumerate(zip(rec.batch_end_ns, rec.batch_size, strict=True))]
        again, answers_from = loop_turns(sent, batches, cost, turn, answer)
        if again == at:
            return rec, at, answers_from
        at = again
    raise AssertionError("no fixed point")


@settings(max_examples=60, deadline=None)
@given(gaps=st.lists(st.integers(0, 400_000), min_size=1, max_size=120),
       cost=st.sampled_from([0, 1, 30_000, 120_000]),
       turn=st.sampled_from([0, 20_000, 200_000]),
       answer=st.sampled_from([1, 50_000, 300_000]),
       mbs=st.sampled_from([1, 4, 8]), delay_us=st.sampled_from([0, 100, 1000]),
       instances=st.integers(1, 3))
def test_the_turns_are_the_fixed_point_of_loop_and_batcher(gaps, cost, turn, answer, mbs,
                                                           delay_us, instances):
    sent = np.cumsum(np.asarray(gaps, np.int64))
    exec_ns = np.array([0.0] + [400_000.0 + 150_000.0 * b for b in range(1, mbs + 1)])
    policy = BatchingPolicy(max_batch_size=mbs, max_queue_delay_microseconds=delay_us)
    rec, at, answers_from = fixed_point(sent.tolist(), exec_ns, policy, instances, cost,
                                        turn, answer)
    got, got_at, answered = answering_run(sent, cost, turn, answer, exec_ns, np.ones(1),
                                          policy, instances)
    assert got_at.tolist() == at
    status, batch, _, _, end, _ = got
    assert np.array_equal(status, rec.status)
    assert np.array_equal(batch, rec.batch)
    assert np.array_equal(end, rec.batch_end_ns)
    # each answer after the earlier ones of its batch, from the batch's first answer on
    for b, first in answers_from.items():
        members = np.flatnonzero(batch == b)
        assert answered[members].tolist() == [first + (k + 1) * answer
                                              for k in range(members.size)]
    assert (answered[batch < 0] == -1).all()


def test_a_busy_loop_hands_the_batcher_more_at_once_worked_by_hand():
    """One instance, batches of up to 8 in 1 ms, no window; parse 0.1 ms, answer 0.5 ms.
    A at 0: handed on at 0.1, runs 0.1-1.1. B at 0.5: handed on at 0.6, waits. At 1.1 the
    loop answers A (to 1.6) while C (1.2) and D (1.3) arrive; B's batch runs 1.1-2.1. The
    turn at 1.6 takes C and D together (to 1.8): one batch of two, 2.1-3.1."""
    ms = 1_000_000
    sent = np.array([0, ms // 2, 12 * ms // 10, 13 * ms // 10], np.int64)
    exec_ns = np.full(9, float(ms))
    got, at, answered = answering_run(sent, ms // 10, 0, ms // 2, exec_ns, np.ones(1),
                                      BatchingPolicy(max_batch_size=8,
                                                     max_queue_delay_microseconds=0), 1)
    _, batch, size, _, end, _ = got
    assert at.tolist() == [ms // 10, 6 * ms // 10, 18 * ms // 10, 18 * ms // 10]
    assert size.tolist() == [1, 1, 2]
    assert batch.tolist() == [0, 1, 2, 2]
    assert end.tolist() == [11 * ms // 10, 21 * ms // 10, 31 * ms // 10]
    # A's answer 1.1-1.6; B's at 2.1-2.6; C's 3.1-3.6, then D's to 4.1
    assert answered.tolist() == [16 * ms // 10, 26 * ms // 10, 36 * ms // 10, 41 * ms // 10]


def _loop(**over: object):
    return load_scenario("seed").with_overrides({
        "workload.num_requests": 4000, "latency.frontend_workers": 1,
        "latency.frontend_event_loop": True, "latency.frontend_cpu_ms": 0.05, **over})


def test_answers_grow_the_batches_and_the_report_counts_them():
    """At 2,000/s with 0.3 ms an answer the loop is busy 70% of the time: batches grow
    and every request's time in the loop (both ends) is in its end-to-end latency."""
    plain = run_simulate(_loop())
    busy = run_simulate(_loop(**{"latency.frontend_answer_ms": 0.3}))
    assert busy.batching.mean_batch_size > 1.3 * plain.batching.mean_batch_size
    sim = simulate(_loop(**{"latency.frontend_answer_ms": 0.3}))
    r = sim.records
    assert (r.status == 0).all()
    # a request's time in the loop: its arrival to the batcher, its batch's end to its answer
    assert (sim.frontend_s * 1e9 >= r.arrival_ns - sim.sent_ns - 1).all()
    assert (sim.frontend_s >= 0.3e-3 - 1e-12).all()  # its own answer at least
    fe = busy.latency.components["frontend"]
    assert fe.mean_ms == pytest.approx(float(sim.frontend_s.mean()) * 1e3)
    e2e = (r.end_ns - r.arrival_ns) / 1e9 + sim.frontend_s
    lat = sim.scenario.latency
    assert lat.is_constant("feature_fetch")
    assert lat.is_constant("network")
    assert busy.latency.p50_ms == pytest.approx(
        float(np.percentile(e2e, 50)) * 1e3 + lat.feature_fetch_ms + lat.network_ms, rel=1e-6)
    same = simulate(_loop(**{"latency.frontend_answer_ms": 0.3}))
    assert np.array_equal(same.records.arrival_ns, r.arrival_ns)  # deterministic


def test_an_answer_cost_needs_an_event_loop():
    with pytest.raises(InputError, match=r"^\[latency\] frontend_answer_ms = 0.2: expected 0 "
                       "unless frontend_event_loop = true"):
        load_scenario("seed").with_overrides({"latency.frontend_workers": 2,
                                              "latency.frontend_answer_ms": 0.2})


def test_an_answering_loop_that_cannot_keep_up_says_so():
    r = run_simulate(_loop(**{"latency.frontend_answer_ms": 0.6}))
    assert any(n.startswith("the front end cannot keep up") for n in r.notes)
