"""Stalls: the whole server pausing, simulated as a time warp (batching/stalls.py).

The warp's two maps are held to their definitions, and a whole simulation with stalls
to a plain queue written here that pauses in real time, with no warp at all."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.api import run_simulate
from servelab.batching.simulate import simulate
from servelab.batching.stalls import Stalls
from servelab.errors import InputError
from servelab.scenario import scenario_from_dict

MS = 1_000_000


def _stalls_of(seed: int, per_s: float, lengths_ms: tuple[float, ...]) -> Stalls:
    """The stalls `simulate` draws for a scenario with this seed (its fifth stream)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(5)[4])
    return Stalls(per_s, lengths_ms, rng)


def test_the_warp_worked_by_hand():
    st_ = Stalls(1.0, (10.0,), np.random.default_rng(0))
    st_.cover(0)
    st_.sigma[:] = np.arange(1, st_.sigma.size + 1) * 1_000 * MS  # every 1 s of server time
    st_.length[:] = 10 * MS
    st_._after[:] = np.cumsum(st_.length)
    # real: running to 1 s, stalled 1.000-1.010 s, running 1.010-2.010 s, stalled to 2.020
    real = np.array([0, 999 * MS, 1_000 * MS, 1_005 * MS, 1_010 * MS, 2_015 * MS, 2_020 * MS])
    assert st_.to_server(real).tolist() == [0, 999 * MS, 1_000 * MS, 1_000 * MS, 1_000 * MS,
                                            2_000 * MS, 2_000 * MS]
    # a server instant at a stall's start is after it; a batch from 0.9995 s to 1.0005 s on
    # the server's clock takes 1 ms of its own and 11 ms of real time
    assert st_.to_real(np.array([999_500_000, 1_000 * MS, 1_000_500_000])).tolist() == [
        999_500_000, 1_010 * MS, 1_010_500_000]
    assert st_.share_paused(2_000 * MS) == pytest.approx(20 / 2_020)


@settings(max_examples=60, deadline=None)
@given(per_s=st.floats(0.5, 200.0), lengths=st.lists(st.floats(0.0, 50.0), min_size=1,
                                                       max_size=5),
       seed=st.integers(0, 2**31), real=st.lists(st.integers(0, 3 * 10**9), min_size=1,
                                                max_size=200))
def test_the_warp_holds_its_definitions(per_s, lengths, seed, real):
    s = Stalls(per_s, tuple(lengths), np.random.default_rng(seed))
    t = np.array(sorted(real), np.int64)
    server = s.to_server(t)
    assert (np.diff(server) >= 0).all()  # the server's clock never runs backwards
    assert (server <= t).all()
    back = s.to_real(server)
    assert (back >= t).all()  # seen at the instant, or at the end of the stall it came in
    # by the definition: the real time spent stalled before each instant, stall by stall
    starts = s.sigma + np.concatenate([[0], np.cumsum(s.length)[:-1]])
    for x, sv, b in zip(t.tolist(), server.tolist(), back.tolist(), strict=True):
        inside = (starts <= x) & (x < starts + s.length)
        if inside.any():
            k = int(np.flatnonzero(inside)[-1])
            assert sv == s.sigma[k]
            assert b == starts[k] + s.length[k]
        else:
            assert sv == x - int(s.length[starts + s.length <= x].sum())
            assert b == x or (s.sigma == sv).any()
    assert (s.to_server(s.to_real(server)) == server).all()


def _queue_that_pauses(arrivals: np.ndarray, service_ns: int, starts: np.ndarray,
                       lengths: np.ndarray) -> np.ndarray:
    """Completion times of one FIFO server (a request at a time), which does nothing
    during [start, start + length) of each pause, in real time and by hand: a request
    starts when it has come and the server is free and not paused, and its work runs
    only outside the pauses (one that would end just as a pause starts ends after it)."""
    done = np.empty(arrivals.size, np.int64)
    free = 0
    k = 0  # the first pause that has not ended by the current instant
    for i, a in enumerate(arrivals.tolist()):
        t = max(a, free)
        work = service_ns
        while True:
            while k < starts.size and starts[k] + lengths[k] <= t:
                k += 1
            if k < starts.size and starts[k] <= t:  # paused: wait for its end
                t = int(starts[k] + lengths[k])
                continue
            nxt = int(starts[k]) if k < starts.size else None
            if nxt is None or t + work < nxt:
                t += work
                break
            work -= nxt - t
            t = nxt
        done[i] = t
        free = t
    return done


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), per_s=st.floats(1.0, 80.0),
       lengths=st.lists(st.floats(0.1, 30.0), min_size=1, max_size=4),
       qps=st.floats(100.0, 900.0))
def test_a_simulation_with_stalls_is_a_queue_that_pauses(seed, per_s, lengths, qps):
    """One instance, a request a batch, a constant 1 ms: each request's end in the
    simulator equals the paused queue's, computed in real time with no warp."""
    sc = scenario_from_dict({
        "workload": {"num_requests": 600, "qps": qps, "seed": seed},
        "model": {"kind": "constant", "latency_ms": 1.0},
        "batching": {"max_batch_size": 1, "max_queue_delay_microseconds": 0},
        "hardware": {"num_gpus": 1}, "latency": {"stalls_per_s": per_s,
                                                 "stall_samples_ms": lengths}})
    sim = simulate(sc)
    r = sim.records
    s = _stalls_of(seed, per_s, tuple(lengths))
    s.cover(int(r.batch_end_ns.max()))
    starts = s.sigma + np.concatenate([[0], np.cumsum(s.length)[:-1]])
    want = _queue_that_pauses(r.arrival_ns, MS, starts, s.length)
    assert (r.status == 0).all()
    assert r.end_ns.tolist() == want.tolist()
    plain = simulate(sc.with_overrides({"latency.stalls_per_s": 0.0}))
    assert np.array_equal(plain.records.arrival_ns, r.arrival_ns)  # the same arrivals


def test_stalls_grow_the_tail_and_leave_a_scenario_without_them_alone():
    base = {"workload": {"num_requests": 20_000, "qps": 800.0}}
    plain = run_simulate(scenario_from_dict(base))
    again = run_simulate(scenario_from_dict({**base, "latency": {"stalls_per_s": 0.0}}))
    assert again.latency.p99_ms == plain.latency.p99_ms
    stalled = run_simulate(scenario_from_dict(
        {**base, "latency": {"stalls_per_s": 5.0, "stall_ms": 20.0}}))
    assert stalled.latency.p99_ms > plain.latency.p99_ms + 10
    assert stalled.batching.mean_batch_size > plain.batching.mean_batch_size
    assert stalled.requests.served == 20_000
    # 5 a second of 20 ms: 0.1 s paused per second running, 1/11 of the time
    assert "the whole server stalls 5 times a second of its running time, 20 ms each on " \
        "average: about 9.1% of the time" in " ".join(stalled.notes)
    assert not any("stalls" in n for n in plain.notes)


def test_the_answering_loop_stalls_too():
    """Behind an event loop that writes the answers, a stall holds the answers too: every
    request's time in the loop is at least its own costs, and the run is deterministic."""
    sc = scenario_from_dict({
        "workload": {"num_requests": 4000, "qps": 1500.0},
        "latency": {"frontend_workers": 1, "frontend_event_loop": True,
                    "frontend_cpu_ms": 0.05, "frontend_answer_ms": 0.1,
                    "stalls_per_s": 20.0, "stall_ms": 8.0}})
    a, b = simulate(sc), simulate(sc)
    assert np.array_equal(a.frontend_s, b.frontend_s)
    assert (a.frontend_s >= 0.15e-3 - 1e-12).all()
    r = a.records
    assert (r.arrival_ns >= a.sent_ns).all()
    assert (r.batch_start_ns[r.batch] >= r.arrival_ns).all()
    plain = run_simulate(sc.with_overrides({"latency.stalls_per_s": 0.0}))
    assert run_simulate(sc).latency.p99_ms > plain.latency.p99_ms + 4


@pytest.mark.parametrize(("over", "match"), [
    ({"stalls_per_s": 3.0}, r"^\[latency\] stalls_per_s = 3.0: expected a stall length"),
    ({"stalls_per_s": 3.0, "stall_samples_ms": [0.0]}, r"expected a stall length"),
    ({"stalls_per_s": 5_000.0, "stall_ms": 1.0}, r"^\[latency\] stalls_per_s = 5000.0"),
    ({"stall_ms": 1e6}, r"^\[latency\] stall_ms = 1000000.0"),
])
def test_bad_stalls_are_refused(over, match):
    with pytest.raises(InputError, match=match):
        scenario_from_dict({"latency": over})


def test_a_run_with_too_many_stalls_is_refused_before_it_draws_them():
    sc = scenario_from_dict({"workload": {"num_requests": 100_000, "qps": 0.05},
                             "latency": {"stalls_per_s": 1_000.0, "stall_ms": 0.001}})
    with pytest.raises(InputError, match=r"stalls_per_s = 1000: over a run of .* expected "
                       r"at most 1,000,000; fix"):
        run_simulate(sc)
