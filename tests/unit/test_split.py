"""Where a request's time went (measure/split.py): measured from the load generator's
result and the gateway's trace, and simulated."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.measure.loadgen import LoadResult
from servelab.measure.split import PHASES, measured_split, simulated_split, split_note
from servelab.trace_file import TraceRequests

MS = 1_000_000
T0 = 5_000 * MS  # the run's start on the monotonic clock


def _run(n: int = 50) -> tuple[LoadResult, TraceRequests]:
    """n requests 10 ms apart: sent 0.1 ms late, 0.3 ms to the queue, 1 ms in it, 2 ms of
    compute, 0.5 ms back; the trace also holds a warm-up's requests before the run."""
    intended = np.arange(n, dtype=np.int64) * 10 * MS
    sent = intended + MS // 10
    queued = sent + 3 * MS // 10
    start, end = queued + MS, queued + 3 * MS
    done = end + MS // 2
    res = LoadResult(intended, sent, done, np.full(n, 200), {}, T0)
    before = np.arange(5, dtype=np.int64) * MS + T0 - 100 * MS  # the warm-up's
    tr = TraceRequests("m", np.concatenate([before, T0 + queued]),
                       np.concatenate([before + MS, T0 + start]),
                       np.concatenate([before + 2 * MS, T0 + end]), 0)
    return res, tr


def test_each_phase_is_read_from_the_client_and_the_trace():
    res, tr = _run()
    got = measured_split(res, tr)
    assert got is not None
    want = dict(zip(PHASES, (0.1, 0.3, 1.0, 2.0, 0.5), strict=True))
    for name, ms in want.items():
        assert got[name] == pytest.approx({"p50": ms, "p90": ms, "p99": ms}), name
    # a request that failed is left out on the client's side
    failed = replace(res, status=np.where(np.arange(50) == 10, 0, 200))
    again = measured_split(failed, tr)
    assert again is not None
    assert again["queue"]["p50"] == pytest.approx(1.0)


def test_no_split_without_the_runs_start_or_with_too_few_requests():
    res, tr = _run()
    assert measured_split(replace(res, t0_ns=0), tr) is None
    few, few_tr = _run(10)
    assert measured_split(few, few_tr) is None


def test_the_simulated_split_at_low_load():
    """One request at a time behind an event loop: it spends the loop's cost a request
    and a turn before the batcher, the batch delay in the queue, its batch's time, and
    the rest of the measured time outside after it (the loop's answer and the outside
    samples: 0.5 ms with the time before the batcher)."""
    from servelab.batching.simulate import simulate
    from servelab.measure.load import Target
    from servelab.measure.validate import (
        Profile,
        ServerPolicy,
        fit_scenario,
        on_arrivals,
    )
    from servelab.scenario import BatchingPolicy

    t = Target("127.0.0.1", 1, "m")
    sp = ServerPolicy(BatchingPolicy(max_batch_size=8, max_queue_delay_microseconds=2000), 1,
                      "flags")
    prof = Profile(rows_ms={1: 2.0, 2: 2.5, 4: 3.5, 8: 5.5}, outside_ms=np.full(200, 0.5),
                   frontend_workers=1, frontend_event_loop=True, frontend_cpu_ms=0.06,
                   frontend_turn_ms=0.02, frontend_answer_ms=0.04)
    offsets = np.arange(200) * 0.05  # 20/s, evenly: never two requests at once
    sim = simulate(on_arrivals(fit_scenario(t, sp, prof), offsets))
    got = simulated_split(sim)
    assert got is not None
    assert got["sent late"]["p99"] == 0
    assert got["send to queue entry"]["p50"] == pytest.approx(0.08)
    assert got["queue"]["p50"] == pytest.approx(2.0)
    assert got["compute"]["p50"] == pytest.approx(2.0)
    assert got["send to queue entry"]["p50"] + got["batch end to answer"]["p50"] == (
        pytest.approx(0.5))
    note = split_note("at 20/s", got, got)
    assert note.startswith("at 20/s the warm-up's time went")
    assert all(name in note for name in PHASES)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 120), t0=st.integers(-5, 10**12),
       late=st.lists(st.integers(-10**9, 10**9), min_size=1, max_size=5),
       codes=st.lists(st.sampled_from([0, 200, 503]), min_size=1, max_size=5))
def test_any_result_and_trace_give_a_split_or_none(n, t0, late, codes):
    """Whatever the client's figures and the trace hold (out of order, failed requests,
    more on one side than the other), the split is None or finite percentiles."""
    rng = np.random.default_rng(n)
    intended = np.sort(rng.integers(0, 10**9, n)).astype(np.int64)
    sent = intended + np.resize(np.asarray(late, np.int64), n)
    done = np.maximum(sent, intended) + rng.integers(0, 10**8, n)
    status = np.resize(np.asarray(codes), n)
    res = LoadResult(intended, sent, done, status, {}, t0)
    m = int(rng.integers(0, 150))
    q = np.sort(rng.integers(0, 2 * 10**12, m)).astype(np.int64)
    start = q + rng.integers(0, 10**7, m)
    tr = TraceRequests("m", q, start, start + rng.integers(0, 10**7, m), 0)
    got = measured_split(res, tr)
    if got is not None:
        assert set(got) == set(PHASES)
        assert all(np.isfinite(v) for part in got.values() for v in part.values())
