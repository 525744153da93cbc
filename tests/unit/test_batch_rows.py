"""Batches are counted in rows, as Triton counts them: the rows rule decides exactly as
the compiled one-row rule on one-row requests, and on requests of several rows it never
passes max_batch_size, ends at preferred sizes counted in rows, and leaves a request
that does not fit for the next batch."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.batching.state import BatcherCore, Payload
from servelab.batching.triton_engine import (
    get_dynamic_batch,
    get_dynamic_batch_rows,
    preference_tables,
)
from servelab.scenario import BatchingPolicy


@st.composite
def states(draw: st.DrawFn) -> tuple:
    mbs = draw(st.integers(1, 40))
    prefs = draw(st.sets(st.integers(1, mbs), max_size=4))
    prefs = prefs or {mbs}
    max_pref = max(prefs)
    k = draw(st.integers(0, mbs))
    q = draw(st.integers(1, 60))
    delay_ns = draw(st.sampled_from([0, 1_000, 100_000, 2_000_000]))
    age_ns = draw(st.integers(0, 3_000_000))
    saturated = draw(st.booleans())
    return mbs, frozenset(prefs), max_pref, k, q, delay_ns, age_ns, saturated


@settings(max_examples=3000, deadline=None)
@given(states())
def test_rows_rule_equals_the_one_row_rule_on_one_row_requests(state):
    mbs, prefs, max_pref, k, q, delay_ns, age_ns, saturated = state
    is_pref = np.zeros(mbs + 1, np.bool_)
    is_pref[list(prefs)] = True
    floor, above = preference_tables(is_pref, mbs)
    one_row = get_dynamic_batch(q, k, age_ns, is_pref, floor, above, int(floor[mbs]), mbs,
                                delay_ns, saturated)
    rows = get_dynamic_batch_rows([1] * q, k, age_ns, prefs, max_pref, mbs, delay_ns,
                                  saturated)
    assert tuple(int(x) for x in one_row) == rows


def run_core(policy: BatchingPolicy, rows: list[int]) -> list[list[int]]:
    """Every request queued at t=0 on one instance, each batch done 1 ms after it starts,
    time in 100 us steps: the batches' requests' row counts in order."""
    batches: list[list[int]] = []
    ends: list[int] = []
    clock = {"t": 0}

    def start(p: Payload[int]) -> None:
        batches.append([rows[i] for i in p.items])
        assert p.rows == sum(batches[-1])
        ends.append(clock["t"] + 1_000_000)

    core: BatcherCore[int] = BatcherCore(policy, 1, start)
    for i, r in enumerate(rows):
        assert core.arrive(i, 0, r)
    for _ in range(100_000):
        t = clock["t"]
        while ends and ends[0] <= t:
            ends.pop(0)
            core.complete(t)
        core.step(t)
        if sum(len(b) for b in batches) == len(rows):
            break
        clock["t"] += 100_000
    return batches


def test_four_row_requests_fill_batches_of_max_batch_size_rows():
    # Measured on Triton 2.51 (the issue): 16 concurrent 4-row requests, max_batch_size
    # 32, ran as 32-row batches; servelab's gateway had run them as 64-row ones.
    policy = BatchingPolicy(max_batch_size=32, max_queue_delay_microseconds=2_000)
    batches = run_core(policy, [4] * 16)
    assert [sum(b) for b in batches] == [32, 32]


def test_a_request_that_does_not_fit_waits_for_the_next_batch():
    policy = BatchingPolicy(max_batch_size=8, max_queue_delay_microseconds=2_000)
    batches = run_core(policy, [3, 3, 3, 1, 8])
    assert batches == [[3, 3], [3, 1], [8]]


def test_preferred_sizes_are_rows():
    policy = BatchingPolicy(max_batch_size=16, max_queue_delay_microseconds=2_000,
                            preferred_batch_size=(4, 8))
    # 2 + 2 rows reach the preferred 4 at the second request; 3 + 3 + 2 reach 8.
    assert run_core(policy, [2, 2, 3, 3, 2]) == [[2, 2], [3, 3, 2]]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 32), st.lists(st.integers(1, 32), min_size=1, max_size=80),
       st.sets(st.integers(1, 32), max_size=3))
def test_no_batch_passes_max_batch_size_rows(mbs, rows, prefs):
    rows = [min(r, mbs) for r in rows]
    policy = BatchingPolicy(max_batch_size=mbs, max_queue_delay_microseconds=2_000,
                            preferred_batch_size=tuple(sorted(p for p in prefs if p <= mbs)))
    batches = run_core(policy, rows)
    assert [r for b in batches for r in b] == rows  # every request, once, in order
    assert all(sum(b) <= mbs for b in batches)
    assert all(len(b) >= 1 for b in batches)


def test_payload_counts_rows():
    p: Payload[int] = Payload()
    assert p.rows == 0
