"""The allocation simulator: allocators conserve memory, every request is accounted for,
and the comparison has the shape the PagedAttention paper reports."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.errors import InputError
from servelab.llm.paging import (
    BlockPool,
    FirstFitArena,
    Strategy,
    Workload,
    simulate_paging,
    synthetic_workload,
)
from servelab.llm.pool import run_paging
from servelab.scenario import load_scenario


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.lists(st.tuples(st.booleans(), st.integers(1, 8)), max_size=60))
def test_block_pool_conserves_blocks(num_blocks, ops):
    pool = BlockPool(num_blocks)
    owned: list[list[int]] = []
    for alloc, n in ops:
        if alloc or not owned:
            free_before = pool.num_free
            got = pool.allocate(n)
            if n > free_before:
                assert got is None  # running out is a returned value
            else:
                assert got is not None
                assert len(got) == n
                owned.append(got)
        else:
            pool.release(owned.pop(0))
        held = [b for blocks in owned for b in blocks]
        assert len(held) == len(set(held))  # no block owned twice
        assert set(held).isdisjoint(pool.free)  # owned or free, never both
        assert len(held) + pool.num_free == num_blocks  # nothing lost, nothing beyond the pool
        assert all(0 <= b < num_blocks for b in held)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 500), st.lists(st.tuples(st.booleans(), st.integers(1, 80)), max_size=60))
def test_first_fit_arena_conserves_slots(capacity, ops):
    arena = FirstFitArena(capacity)
    owned: list[tuple[int, int]] = []
    for alloc, n in ops:
        if alloc or not owned:
            start = arena.allocate(n)
            if start is None:
                assert arena.largest_hole < n
            else:
                owned.append((start, n))
        else:
            arena.release(*owned.pop(len(owned) // 2))
        spans = sorted(owned)
        assert all(a + n <= b for (a, n), (b, _) in itertools.pairwise(spans))
        assert all(a >= 0 and a + n <= capacity for a, n in spans)
        assert sum(n for _, n in owned) + arena.num_free == capacity
    for span in owned:
        arena.release(*span)
    assert arena.holes == [(0, capacity)]


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 40))
    max_len = draw(st.integers(8, 200))
    prefix = draw(st.sampled_from([0, 0, 16, 32]))
    prefix = min(prefix, max_len - 2)
    prompt = np.array(draw(st.lists(st.integers(1, max_len), min_size=n, max_size=n)))
    prompt = np.minimum(prompt + prefix, max_len - 1)
    output = np.array(draw(st.lists(st.integers(1, max_len), min_size=n, max_size=n)))
    output = np.minimum(output, max_len - prompt)
    steps = np.sort(np.array(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))))
    return Workload(steps, prompt, output, prefix), max_len


@settings(max_examples=150, deadline=None)
@given(workloads(), st.sampled_from(list(Strategy)), st.integers(16, 600),
       st.sampled_from([1, 4, 16]), st.integers(1, 8))
def test_every_request_is_accounted_for(wl, strategy, pool_tokens, block, max_seqs):
    work, max_len = wl
    r = simulate_paging(work, strategy, pool_tokens, block_size=block, max_len=max_len,
                        max_num_seqs=max_seqs, max_steps=20_000)
    n = work.prompt.size
    assert r.completed + r.rejected_too_long + r.running_at_end + r.waiting_at_end == n
    assert r.max_concurrency <= max_seqs
    for shares in (r.overall, r.under_load):
        assert sum(shares.values()) == pytest.approx(1.0)
        assert all(v >= 0 for v in shares.values())
    if not strategy.paged:
        assert r.preemptions == 0  # a contiguous reservation never has to grow


def test_paper_shape_contiguous_max_fifth_paged_over_ninety():
    rng = np.random.default_rng(0)
    work = synthetic_workload("sharegpt", 1500, 0.6, 2048, 0, rng)
    share = {st: simulate_paging(work, st, 13_536, max_len=2048).under_load["token"]
             for st in (Strategy.CONTIGUOUS_MAX, Strategy.CONTIGUOUS_ORACLE, Strategy.PAGED)}
    assert 0.1 < share[Strategy.CONTIGUOUS_MAX] < 0.3
    assert share[Strategy.CONTIGUOUS_MAX] < share[Strategy.CONTIGUOUS_ORACLE] < 0.7
    assert share[Strategy.PAGED] > 0.9


def test_shared_prefix_raises_concurrency():
    s = load_scenario("seed")
    r = run_paging(s, num_requests=600, max_len=2048, prefix_tokens=256,
                   strategies=[Strategy.PAGED, Strategy.PAGED_PREFIX])
    paged, shared = r.results
    assert shared.mean_concurrency > 1.2 * paged.mean_concurrency


def test_run_paging_errors():
    s = load_scenario("seed")
    with pytest.raises(InputError, match="--lengths"):
        run_paging(s, lengths="sharegtp", num_requests=10)
    with pytest.raises(InputError, match="--prefix-tokens"):
        run_paging(s, num_requests=10, max_len=64, prefix_tokens=100)
