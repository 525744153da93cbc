"""Property tests: the batcher's rules hold for any arrivals and any policy, and the
engine agrees request by request with an independent SimPy model of the same rules."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servelab.batching.engine import REJECTED, SERVED, TIMED_OUT
from servelab.batching.simulate import simulate_policy
from servelab.scenario import BatchingPolicy
from tests.reference.simpy_triton import simulate_simpy_triton

US = 1000  # ns


@st.composite
def cases(draw):
    mbs = draw(st.integers(1, 8))
    prefs = draw(st.lists(st.integers(1, mbs), max_size=3, unique=True))
    policy = BatchingPolicy(
        max_batch_size=mbs,
        preferred_batch_size=tuple(sorted(prefs)),
        max_queue_delay_microseconds=draw(st.sampled_from([0, 100, 250, 1000, 3000])),
        max_queue_size=draw(st.sampled_from([0, 0, 2, 5, 20])),
        default_timeout_microseconds=draw(st.sampled_from([0, 0, 500, 2000, 5000])),
    )
    instances = draw(st.integers(1, 3))
    n = draw(st.integers(1, 120))
    # Arrivals on a coarse 50 us grid, so that ties with timers and completions happen.
    gaps = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    arrivals = np.cumsum(np.asarray(gaps, dtype=np.int64) * 50 * US)
    base = draw(st.integers(1, 20)) * 50 * US
    per_row = draw(st.integers(0, 10)) * 50 * US
    table = np.array([0.0] + [base + per_row * b for b in range(1, mbs + 1)])
    exponential = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    mult = (np.random.default_rng(seed).exponential(1.0, n) if exponential else np.ones(n))
    return policy, instances, arrivals, table, mult


def busy_intervals(r, inst):
    on = r.batch_instance == inst
    return sorted(zip(r.batch_start_ns[on].tolist(), r.batch_end_ns[on].tolist(), strict=True))


def covered(intervals, lo, hi):
    """Is [lo, hi) inside the union of the (sorted, disjoint) intervals?"""
    t = lo
    for s, e in intervals:
        if s > t:
            return False
        t = max(t, e)
        if t >= hi:
            return True
    return t >= hi


SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(cases())
def test_rules_hold(case):
    policy, c, arrivals, table, mult = case
    r = simulate_policy(arrivals, table, mult, policy, c)
    served = r.status == SERVED
    counts = r.counts
    # Conservation: every arrival is served, rejected or timed out, exactly once.
    assert set(np.unique(r.status)) <= {SERVED, REJECTED, TIMED_OUT}
    assert counts["served"] + counts["rejected"] + counts["timed_out"] == len(arrivals)
    assert int(r.batch_size.sum()) == counts["served"]
    # No batch over max_batch_size, none empty.
    assert ((r.batch_size >= 1) & (r.batch_size <= policy.max_batch_size)).all()
    # FIFO: served requests start in arrival order, never before they arrive.
    assert (r.start_ns[served] >= r.arrival_ns[served]).all()
    assert (np.diff(r.start_ns[served]) >= 0).all()
    # An instance runs one batch at a time.
    for k in range(c):
        iv = busy_intervals(r, k)
        assert all(e1 <= s2 for (_, e1), (s2, _) in itertools.pairwise(iv))
    # No request waits past its delay while an instance is idle.
    delay = policy.max_queue_delay_microseconds * US
    per_inst = [busy_intervals(r, k) for k in range(c)]
    left = np.where(served, r.start_ns, r.end_ns)  # when it left the queue
    for i in np.flatnonzero(r.status != REJECTED):
        due = r.arrival_ns[i] + delay
        if left[i] > due:
            assert all(covered(iv, due, left[i]) for iv in per_inst), i
    # Timeouts: the timed out waited exactly the timeout (Triton runs a payload's requests
    # whatever they waited, so a served one may have waited longer).
    if policy.default_timeout_microseconds:
        to = policy.default_timeout_microseconds * US
        t_out = r.status == TIMED_OUT
        assert (r.end_ns[t_out] - r.arrival_ns[t_out] == to).all()


@SETTINGS
@given(cases())
def test_engine_agrees_with_independent_simpy_model(case):
    policy, c, arrivals, table, mult = case
    r = simulate_policy(arrivals, table, mult, policy, c)
    ref = simulate_simpy_triton(arrivals, table, mult, set(policy.preferred_batch_size),
                                policy.max_batch_size, policy.max_queue_delay_microseconds * US,
                                c, policy.max_queue_size, policy.default_timeout_microseconds * US)
    np.testing.assert_array_equal(r.status, ref["status"])
    np.testing.assert_array_equal(r.start_ns, ref["start_ns"])
    np.testing.assert_array_equal(r.end_ns, ref["end_ns"])


@SETTINGS
@given(cases())
def test_batcher_first_agrees_with_the_simpy_model_too(case):
    """With batcher_first = 1 the woken thread looks before the freed instance takes the
    next payload at every completion: the same exact agreement."""
    policy, c, arrivals, table, mult = case
    policy = replace(policy, batcher_first=1.0)
    r = simulate_policy(arrivals, table, mult, policy, c)
    ref = simulate_simpy_triton(arrivals, table, mult, set(policy.preferred_batch_size),
                                policy.max_batch_size, policy.max_queue_delay_microseconds * US,
                                c, policy.max_queue_size, policy.default_timeout_microseconds * US,
                                batcher_first=True)
    np.testing.assert_array_equal(r.status, ref["status"])
    np.testing.assert_array_equal(r.start_ns, ref["start_ns"])
    np.testing.assert_array_equal(r.end_ns, ref["end_ns"])


@st.composite
def quiet_cases(draw):
    """Policies the Triton engine runs on its quiet path (no timeout, no queue limit, a
    window of at least 1 us, no preferred size below the largest), with arrivals and
    service times to the nanosecond (the window's whole microseconds are recomputed at
    each completion) and on a coarse grid (ties with timers and completions)."""
    mbs = draw(st.integers(2, 8))
    policy = BatchingPolicy(
        max_batch_size=mbs,
        preferred_batch_size=draw(st.sampled_from([(), (mbs,)])),
        max_queue_delay_microseconds=draw(st.sampled_from([1, 7, 250, 1000, 3000])),
    )
    n = draw(st.integers(1, 300))
    grid = draw(st.sampled_from([1, 50 * US]))
    gaps = draw(st.lists(st.integers(0, 20 * 50 * US // grid), min_size=n, max_size=n))
    arrivals = np.cumsum(np.asarray(gaps, dtype=np.int64) * grid)
    base = draw(st.integers(1, 2000 * US // grid)) * grid
    per_row = draw(st.integers(0, 400 * US // grid)) * grid
    table = np.array([0.0] + [base + per_row * b for b in range(1, mbs + 1)])
    seed = draw(st.integers(0, 2**32 - 1))
    mult = (np.random.default_rng(seed).exponential(1.0, n) if draw(st.booleans())
            else np.ones(n))
    return policy, draw(st.integers(1, 3)), arrivals, table, mult


@SETTINGS
@given(quiet_cases())
def test_the_quiet_path_agrees_with_the_simpy_model(case):
    """The Triton engine's fast path for a batcher that keeps up (`_quiet_run`) hands
    over to the general loop and back whenever a payload would wait or a full batch
    leaves requests queued: request by request the same as the SimPy model."""
    policy, c, arrivals, table, mult = case
    r = simulate_policy(arrivals, table, mult, policy, c)
    ref = simulate_simpy_triton(arrivals, table, mult, set(policy.preferred_batch_size),
                                policy.max_batch_size, policy.max_queue_delay_microseconds * US,
                                c)
    np.testing.assert_array_equal(r.status, ref["status"])
    np.testing.assert_array_equal(r.start_ns, ref["start_ns"])
    np.testing.assert_array_equal(r.end_ns, ref["end_ns"])


def run_in_parts(policy, c, arrivals, table, mult, parts, seed):
    """The engine called a part at a time, as simulate_policy calls it, but with each part
    filled in only just before the call: the arrivals past it read as garbage (before
    every arrival), so a call that looked past its part would change the records."""
    from servelab.batching.engine import (
        DONE,
        MORE_ROOM,
        S_NB,
        more_room,
        new_records,
        new_state,
    )
    from servelab.batching.triton_engine import run_batcher_triton

    n = arrivals.size
    buf = np.full(n, -(2**40), np.int64)
    preferred = np.zeros(policy.max_batch_size + 1, np.bool_)
    preferred[list(policy.effective_preferred)] = True
    records, state = new_records(n, 1), new_state(c)  # little room: more as it goes
    args = (buf, table.astype(np.float64), mult.astype(np.float64), preferred,
            policy.max_batch_size, policy.max_queue_delay_microseconds * US, c,
            policy.max_queue_size, policy.default_timeout_microseconds * US)
    for limit in [*parts, n]:
        buf[:limit] = arrivals[:limit]
        while True:
            code = run_batcher_triton(*args, records, state, limit, policy.batcher_first, seed)
            if code != MORE_ROOM:
                break
            records = more_room(records, int(state[0][S_NB]))
    assert code == DONE
    nb = int(state[0][S_NB])
    status, batch, size, start, end, inst, _ = records
    return status, batch, size[:nb], start[:nb], end[:nb], inst[:nb]


@SETTINGS
@given(st.one_of(cases(), quiet_cases()), st.lists(st.integers(1, 300), max_size=8),
       st.sampled_from([0.0, 0.0, 0.5, 1.0]))
def test_a_run_in_parts_equals_a_run_at_once(case, cuts, batcher_first):
    """A run goes a part of the arrivals at a time while the next part is drawn: each
    call stops before the first instant it may not know every arrival of, and the next
    goes on from its state, to the same records as one call."""
    policy, c, arrivals, table, mult = case
    policy = replace(policy, batcher_first=batcher_first)
    whole = simulate_policy(arrivals, table, mult, policy, c, seed=3)
    parts = sorted({min(k, arrivals.size) for k in cuts})
    got = run_in_parts(policy, c, arrivals, table, mult, parts, 3)
    for field, value in zip(("status", "batch", "batch_size", "batch_start_ns",
                             "batch_end_ns", "batch_instance"), got, strict=True):
        np.testing.assert_array_equal(value, getattr(whole, field), err_msg=field)


@settings(max_examples=30, deadline=None)
@given(cases(), st.integers(1, 8), st.integers(1, 30))
def test_arrivals_drawn_on_a_second_thread_give_the_same_run(case, first, part):
    """simulate_policy with `draw`: the parts drawn in order on another thread while the
    engine runs, handed over part by part; the same records as the arrivals given whole."""
    from unittest import mock

    from servelab.batching import simulate as sim

    policy, c, arrivals, table, mult = case
    whole = simulate_policy(arrivals, table, mult, policy, c)
    buf = np.full(arrivals.size, -(2**40), np.int64)
    drawn = []

    def draw(upto: int) -> None:
        buf[:upto] = arrivals[:upto]
        drawn.append(upto)

    with mock.patch.object(sim, "FIRST_PART", first), mock.patch.object(sim, "PART", part):
        parted = simulate_policy(buf, table, mult, policy, c, draw=draw)
    assert drawn == sorted(drawn)
    assert drawn[-1] == arrivals.size
    for field in ("status", "batch", "batch_size", "batch_start_ns", "batch_end_ns",
                  "batch_instance"):
        np.testing.assert_array_equal(getattr(parted, field), getattr(whole, field))


def test_an_instance_merges_the_payloads_behind_the_one_it_takes():
    """Triton's InstanceQueue::Dequeue, traced by hand from the source (max_batch_size
    8, preferred 2, 1 ms delay, one instance, 10 ms batches, arrivals every 0.1 ms from
    0): [r0 r1] closes at the preferred 2 and runs at 0.1 ms; [r2 r3] closes at 2 and
    waits; r5 wakes the thread, which gives the waiting payload one more (r4: its size
    is past the largest preferred, so it is saturated); [r5] closes at its delay (1.5
    ms) as a second waiting payload. At 10.1 ms the instance takes [r2 r3 r4], and [r5],
    whose oldest request has waited past the delay and which fits, is merged into it:
    one batch of 4, not 3 and then 1."""
    arrivals = np.arange(6, dtype=np.int64) * 100 * US
    table = np.full(9, 10_000.0 * US)
    policy = BatchingPolicy(max_batch_size=8, preferred_batch_size=(2,),
                            max_queue_delay_microseconds=1000)
    mult = np.ones(6)
    r = simulate_policy(arrivals, table, mult, policy, 1)
    assert r.batch_size.tolist() == [2, 4]
    assert r.start_ns.tolist() == [100 * US] * 2 + [10_100 * US] * 4
    ref = simulate_simpy_triton(arrivals, table, mult, {2}, 8, 1000 * US, 1)
    np.testing.assert_array_equal(r.start_ns, ref["start_ns"])


def test_merged_payloads_agree_with_the_simpy_model_at_load():
    rng = np.random.default_rng(5)
    arrivals = np.cumsum(rng.exponential(1e9 / 2500, 4000)).astype(np.int64)
    table = np.array([0.0] + [3e6 + 1e5 * b for b in range(1, 17)])
    policy = BatchingPolicy(max_batch_size=16, preferred_batch_size=(4,),
                            max_queue_delay_microseconds=1000)
    mult = np.ones(arrivals.size)
    r = simulate_policy(arrivals, table, mult, policy, 1)
    ref = simulate_simpy_triton(arrivals, table, mult, {4}, 16, 1000 * US, 1)
    np.testing.assert_array_equal(r.start_ns, ref["start_ns"])
    np.testing.assert_array_equal(r.end_ns, ref["end_ns"])
