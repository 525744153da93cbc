"""The batching rules, case by case, with times worked out by hand, on an idle instance
(the delay, preferred sizes, the queue bound, timeouts, accounting). What Triton's
batcher thread does while every instance is busy has its cases in test_triton_engine.py."""

from __future__ import annotations

import numpy as np

from servelab.batching.engine import REJECTED, SERVED, TIMED_OUT
from tests.conftest import MS, run_ms


def batches(r):  # (start ms, size) per batch
    return [(int(s) / MS, int(b)) for s, b in zip(r.batch_start_ns, r.batch_size, strict=True)]


def test_delay_clock_runs_from_the_oldest_request():
    r = run_ms([0, 1, 1.5, 5], 1.0, max_batch_size=8, max_queue_delay_microseconds=2000)
    # 0, 1, 1.5 go when request 0 has waited 2 ms; request 3 waits its own 2 ms.
    assert batches(r) == [(2.0, 3), (7.0, 1)]
    assert (r.end_ns[:3] == 3 * MS).all()


def test_full_batch_goes_at_once_without_waiting_for_the_delay():
    r = run_ms([0, 1, 2], 1.0, max_batch_size=2, max_queue_delay_microseconds=10_000)
    assert batches(r) == [(1.0, 2), (12.0, 1)]


def test_preferred_size_is_sent_at_once_and_exactly():
    r = run_ms([0, 1, 2], 1.0, max_batch_size=4, preferred_batch_size=(2,),
               max_queue_delay_microseconds=10_000)
    assert batches(r) == [(1.0, 2), (12.0, 1)]


def test_largest_fitting_preferred_size_wins():
    # Five at once, preferred 2 and 3: send 3, then 2 when the instance frees up.
    r = run_ms([0, 0, 0, 0, 0], 1.0, max_batch_size=8, preferred_batch_size=(2, 3),
               max_queue_delay_microseconds=10_000)
    assert batches(r) == [(0.0, 3), (1.0, 2)]


def test_preferred_size_beats_a_full_max_batch_before_the_delay():
    # Triton sends the largest preferred size even when max_batch_size rows are queued.
    r = run_ms([0] * 10, 1.0, max_batch_size=8, preferred_batch_size=(4,),
               max_queue_delay_microseconds=10_000)
    assert batches(r)[0] == (0.0, 4)
    # The payload formed while it runs is test_triton_engine's (a waiting payload of the
    # largest preferred size takes one more); the rest waits for the delay (10 ms after
    # its arrival at 0).
    assert batches(r)[-1][0] == 10.0
    assert sum(b for _, b in batches(r)) == 10


def test_expired_delay_sends_everything_pending_up_to_max():
    r = run_ms([0, 0, 0], 5.0, max_batch_size=8, preferred_batch_size=(4,),
               max_queue_delay_microseconds=1000)
    assert batches(r) == [(1.0, 3)]


def test_zero_delay_sends_whatever_is_queued():
    r = run_ms([0, 0.5, 0.6, 0.7], 1.0, max_batch_size=8)
    assert batches(r) == [(0.0, 1), (1.0, 3)]


def test_shared_queue_feeds_every_instance():
    r = run_ms([0, 0, 0], 4.0, instances=2, max_batch_size=1)
    assert batches(r) == [(0.0, 1), (0.0, 1), (4.0, 1)]
    assert sorted(r.batch_instance.tolist()[:2]) == [0, 1]


def test_max_queue_size_rejects_at_enqueue():
    r = run_ms([0, 1, 2, 3, 4], 10.0, max_batch_size=1, max_queue_size=2)
    # 0 runs 0-10 ms; 1 and 2 fill the queue; 3 and 4 are rejected on arrival.
    assert r.status.tolist() == [SERVED, SERVED, SERVED, REJECTED, REJECTED]
    assert r.end_ns[3] == 3 * MS


def test_timeout_removes_requests_that_waited_too_long():
    r = run_ms([0, 1, 2], 10.0, max_batch_size=1, default_timeout_microseconds=3000)
    assert r.status.tolist() == [SERVED, TIMED_OUT, TIMED_OUT]
    assert r.end_ns.tolist() == [10 * MS, 4 * MS, 5 * MS]


def test_request_dispatched_at_its_deadline_is_served():
    r = run_ms([0, 0], 3.0, max_batch_size=1, default_timeout_microseconds=3000)
    assert r.status.tolist() == [SERVED, SERVED]


def test_timeout_shorter_than_delay_times_out_on_an_idle_gpu():
    r = run_ms([0], 1.0, max_batch_size=8, max_queue_delay_microseconds=5000,
               default_timeout_microseconds=2000)
    assert r.status.tolist() == [TIMED_OUT]
    assert r.end_ns[0] == 2 * MS


def test_service_time_by_batch_size_and_multiplier():
    r = run_ms([0, 0, 5], [1.0, 2.0], max_batch_size=2, multipliers=[1.5, 0.5, 1.0])
    assert batches(r) == [(0.0, 2), (5.0, 1)]
    assert r.batch_end_ns.tolist() == [3 * MS, int(5.5 * MS)]


def test_every_request_is_accounted_for():
    rng = np.random.default_rng(3)
    arr = np.sort(rng.uniform(0, 50, 400)).tolist()
    r = run_ms(arr, 2.0, instances=2, max_batch_size=4, max_queue_delay_microseconds=500,
               max_queue_size=6, default_timeout_microseconds=1000)
    c = r.counts
    assert c["arrivals"] == c["served"] + c["rejected"] + c["timed_out"] == 400
    assert c["rejected"] > 0
    assert c["timed_out"] > 0
    assert c["served"] > 0
    assert int(r.batch_size.sum()) == c["served"]


def test_runs_of_small_batches_get_room_for_every_batch():
    """The per-batch records start with room for a batch per 4 requests; a run of batches
    of one overflows that and runs again with room for all: same result as one batch per
    request."""
    from servelab.batching.simulate import simulate_policy
    from servelab.scenario import BatchingPolicy

    n = 5_000
    arrivals = np.arange(n, dtype=np.int64) * 10 * MS  # far apart: every batch holds one
    table = np.full(33, 1.0 * MS)
    r = simulate_policy(arrivals, table, np.ones(1), BatchingPolicy(), 1)
    assert r.batch_size.size == n
    assert (r.batch_size == 1).all()
    assert (r.batch == np.arange(n)).all()
    assert (r.status == SERVED).all()
    assert (r.end_ns - r.start_ns == MS).all()
    # a batch per 5 requests fits the first room
    bunched = np.repeat(np.arange(n // 5, dtype=np.int64) * 10 * MS, 5)
    r5 = simulate_policy(bunched, table, np.ones(1), BatchingPolicy(), 1)
    assert r5.batch_size.size == n // 5
    assert (r5.batch_size == 5).all()


def test_a_clock_past_int64_is_refused_when_a_later_part_shows_it():
    """Arrivals are drawn in parts as the engine goes, each part checked before the engine
    runs on it: a run whose worst case passes int64 nanoseconds only once most of its
    arrivals are known is refused with the scenario's message, not run into overflow."""
    import pytest

    from servelab.api import run_simulate
    from servelab.errors import InputError
    from servelab.scenario import scenario_from_dict

    def hour_long(n: int):  # type: ignore[no-untyped-def]
        return scenario_from_dict({"workload": {"num_requests": n, "qps": 1000.0},
                                   "model": {"kind": "constant", "latency_ms": 3.6e6}})

    # 640,000 one-hour batches in a row pass 2**61 ns: the parts up to 589,824 arrivals
    # pass the check, the next (655,360) does not
    with pytest.raises(InputError, match=r"num_requests = 700,000: the run could reach"):
        run_simulate(hour_long(700_000))
    assert run_simulate(hour_long(600_000)).requests.served == 600_000
