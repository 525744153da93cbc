"""The server's front end as a CPU station before the batcher ([latency] frontend_workers,
frontend_cpu_ms): held to a c-server first-come-first-served queue written out here with a
heap, and to the Report's accounting."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.api import run_simulate
from servelab.batching.simulate import FIRST_PART, frontend_pass, simulate
from servelab.errors import InputError
from servelab.scenario import load_scenario


def fcfs_departures(arrival_ns: list[int], workers: int, cost_ns: int) -> list[int]:
    """Each request, in arrival order, takes the worker that frees first (a heap of the
    workers' free instants): the textbook G/D/c queue, with no shortcut."""
    free = [0] * workers
    out = []
    for a in arrival_ns:
        start = max(a, heapq.heappop(free))
        heapq.heappush(free, start + cost_ns)
        out.append(start + cost_ns)
    return out


def event_loop_departures(arrival_ns: list[int], cost_ns: int, turn_ns: int = 0) -> list[int]:
    """One loop in turns, written plainly: a turn starts when the loop is free and a
    request waits, takes every request arrived by then, and hands them on at its end
    (its own cost plus each request's)."""
    out: list[int] = []
    free, i = 0, 0
    while i < len(arrival_ns):
        start = max(arrival_ns[i], free)
        turn = [a for a in arrival_ns[i:] if a <= start]
        free = start + turn_ns + len(turn) * cost_ns
        out += [free] * len(turn)
        i += len(turn)
    return out


def in_parts(arrival: np.ndarray, cuts: list[int], workers: int, cost_ns: int,
             event_loop: bool, turn_ns: int = 0) -> list[int]:
    """The front end as simulate runs it: arrivals known a part at a time, more drawn
    when an event loop's turn reaches past them."""
    out = np.zeros(arrival.size, np.int64)
    passed, n = 0, arrival.size
    for upto in [*cuts, n]:
        known = upto
        while passed < upto:
            passed = frontend_pass(arrival, out, passed, upto, known, n, workers, cost_ns,
                                   event_loop, turn_ns)
            known = min(n, known + 1)
    return out.tolist()


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.integers(0, 3_000), min_size=1, max_size=300),
       workers=st.integers(1, 12), cost_ns=st.integers(1, 5_000),
       cuts=st.lists(st.floats(0, 1), max_size=4))
def test_the_threads_are_a_first_come_first_served_queue_in_any_parts(gaps, workers, cost_ns,
                                                                       cuts):
    arrival = np.cumsum(np.asarray(gaps, np.int64))
    at = sorted(int(c * arrival.size) for c in cuts)
    assert in_parts(arrival, at, workers, cost_ns, False) == fcfs_departures(
        arrival.tolist(), workers, cost_ns)


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.integers(0, 3_000), min_size=1, max_size=300),
       cost_ns=st.integers(1, 5_000), turn_ns=st.sampled_from([0, 1, 700, 4_000]),
       cuts=st.lists(st.floats(0, 1), max_size=4))
def test_the_event_loop_hands_on_each_turn_whole_in_any_parts(gaps, cost_ns, turn_ns, cuts):
    arrival = np.cumsum(np.asarray(gaps, np.int64))
    at = sorted(int(c * arrival.size) for c in cuts)
    assert in_parts(arrival, at, 1, cost_ns, True, turn_ns) == event_loop_departures(
        arrival.tolist(), cost_ns, turn_ns)


def base(**over: object):
    return load_scenario("seed").with_overrides({"workload.num_requests": 3 * FIRST_PART,
                                                  **over})


@pytest.mark.parametrize(("workers", "cpu_ms", "loop"),
                         [(1, 0.3, False), (2, 0.9, False), (8, 3.0, False), (1, 0.3, True),
                          (1, 0.49, True)])
def test_the_batcher_sees_each_request_as_it_leaves_the_front_end(workers, cpu_ms, loop):
    """A run long enough to be drawn in parts: the batcher's arrivals are the front end's
    departures on the scenario's own arrivals, and the Report counts the difference."""
    plain = simulate(base())
    s = base(**{"latency.frontend_workers": workers, "latency.frontend_cpu_ms": cpu_ms,
                "latency.frontend_event_loop": loop})
    sim = simulate(s)
    arrivals, cost = plain.records.arrival_ns.tolist(), round(cpu_ms * 1e6)
    want = (event_loop_departures(arrivals, cost) if loop
            else fcfs_departures(arrivals, workers, cost))
    assert sim.records.arrival_ns.tolist() == want
    assert np.array_equal(sim.frontend_s,
                          (np.asarray(want) - plain.records.arrival_ns) / 1e9)
    r = run_simulate(s)
    fe = r.latency.components["frontend"]
    assert fe.p50_ms >= cpu_ms - 1e-9  # every request pays the work, some also wait
    assert fe.mean_ms == pytest.approx(float(sim.frontend_s.mean()) * 1e3)
    parts = ("frontend", "feature_fetch", "queue", "gpu", "network")
    assert sum(r.latency.components[k].mean_ms for k in parts) == pytest.approx(
        r.latency.mean_ms)


def test_no_station_leaves_the_report_as_it_was():
    """Either figure at 0 is no station: the same Report to the bit, its front end 0."""
    def figures(over: dict) -> dict:
        d = run_simulate(base(**over)).to_dict()
        d.pop("scenario", None)  # the input, which differs
        return d

    plain = figures({})
    for over in ({"latency.frontend_workers": 4}, {"latency.frontend_cpu_ms": 2.0}):
        assert figures(over) == plain
    assert plain["latency"]["components"]["frontend"]["p99_ms"] == 0.0


def test_a_front_end_that_cannot_keep_up_is_named():
    # the seed offers 2,000 requests/s; one worker of 0.6 ms passes at most 1,667/s
    r = run_simulate(base(**{"latency.frontend_workers": 1, "latency.frontend_cpu_ms": 0.6}))
    assert any(n.startswith("the front end cannot keep up: 2,000 requests/s offered to 1 "
                            "worker(s) of 0.6 ms") for n in r.notes)
    fine = run_simulate(base(**{"latency.frontend_workers": 2, "latency.frontend_cpu_ms": 0.6}))
    assert not any("front end" in n for n in fine.notes)


def test_an_event_loop_is_one_thread():
    with pytest.raises(InputError, match=r"^\[latency\] frontend_workers = 2: expected 1 with "
                       "frontend_event_loop = true"):
        base(**{"latency.frontend_workers": 2, "latency.frontend_event_loop": True})


def test_a_cost_per_turn_is_an_event_loops():
    with pytest.raises(InputError, match=r"^\[latency\] frontend_turn_ms = 0.5: expected 0 "
                       "unless frontend_event_loop = true"):
        base(**{"latency.frontend_workers": 2, "latency.frontend_cpu_ms": 0.1,
                "latency.frontend_turn_ms": 0.5})
    for bad in (-1.0, float("nan"), "x"):
        with pytest.raises(InputError, match=r"frontend_turn_ms"):
            base(**{"latency.frontend_workers": 1, "latency.frontend_event_loop": True,
                    "latency.frontend_cpu_ms": 0.1, "latency.frontend_turn_ms": bad})


@settings(max_examples=60, deadline=None)
@given(workers=st.one_of(st.integers(-5, 2_000), st.floats(allow_nan=True), st.text(max_size=5)),
       cpu_ms=st.one_of(st.floats(-10, 1e7), st.just(float("nan")), st.integers(-5, 10**8),
                        st.text(max_size=5)))
def test_any_front_end_input_is_simulated_or_refused_by_name(workers, cpu_ms):
    def run():  # type: ignore[no-untyped-def]
        try:
            s = load_scenario("seed").with_overrides({
                "workload.num_requests": 500, "latency.frontend_workers": workers,
                "latency.frontend_cpu_ms": cpu_ms})
        except InputError as exc:
            return "refused", str(exc)
        try:
            return "ran", run_simulate(s)
        except InputError as exc:  # a run too long for int64 nanoseconds, said so
            return "too long", str(exc)

    what, got = run()
    if what == "refused":
        assert "[latency] frontend_" in got
    elif what == "too long":
        assert "fix:" in got
    else:
        assert got.requests.served == 500
        assert got.latency.components["frontend"].mean_ms >= 0
