"""The ~500 ms gaps of Triton's lost wake-up, as validate and replay-trace find them."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.batching.engine import SERVED
from servelab.batching.simulate import simulate_policy
from servelab.measure.gaps import (
    answer_gaps,
    batch_gaps,
    full_queue_stalls,
    gap_note,
    timeout_stalls,
)
from servelab.scenario import BatchingPolicy

MS = 1_000_000


def test_a_500_ms_silence_with_a_request_waiting_is_a_gap():
    # answers every 5 ms; the one sent at 12 ms waits through a silence from 15 to 515 ms
    sent = np.array([0, 5, 10, 12, 515, 520]) * MS
    done = np.array([5, 10, 15, 515, 520, 525]) * MS
    assert answer_gaps(sent, done) == (1, 0.5)


def test_an_idle_server_with_nothing_waiting_has_no_gap():
    # the same silence, but the next request is sent only after it: no one waited
    sent = np.array([0, 5, 10, 514, 520]) * MS
    done = np.array([5, 10, 15, 515, 525]) * MS
    assert answer_gaps(sent, done) == (0, 0.0)
    # and a silence far from 500 ms is not the batcher's wait
    sent = np.array([0, 5, 10, 12]) * MS
    done = np.array([5, 10, 15, 215]) * MS
    assert answer_gaps(sent, done) == (0, 0.0)


def test_a_trace_gap_counts_only_when_every_instance_is_idle_and_a_request_queued():
    # two instances: batches 0-10 and 5-505; a request queued at 20 starts at 506: the
    # second instance was busy until 505, so the idle time is 1 ms, not 496
    queue = np.array([0, 5, 20]) * MS
    start = np.array([0, 5, 506]) * MS
    end = np.array([10, 505, 510]) * MS
    assert batch_gaps(queue, start, end) == (0, 0.0)
    # one instance: 0-10, and a request queued at 5 waits until 510
    assert batch_gaps(np.array([0, 5]) * MS, np.array([0, 510]) * MS,
                      np.array([10, 515]) * MS) == (1, 0.5)
    # queued only at 20, after the instance was free: an arrival wakes the batcher
    assert batch_gaps(np.array([0, 20]) * MS, np.array([0, 510]) * MS,
                      np.array([10, 515]) * MS) == (0, 0.0)


def test_the_note_says_what_to_set():
    assert gap_note(0, 0.0, "x") == []
    (note,) = gap_note(3, 1.5, "at 200/s")
    assert note.startswith("at 200/s: 3 gap(s) of about 500 ms (1.5 s in all)")
    assert "lost_wakeup" in note


def test_full_queue_stalls_counts_500_ms_gaps_after_answers_with_a_full_queue():
    # queue limit 3; answers every 5 ms; at 15 ms three requests wait (sent at 11, 12,
    # 13 ms): a full queue, then 500 ms of silence: one stall in one chance. At 515 ms
    # two wait: no chance.
    sent = np.array([0, 5, 10, 11, 12, 13, 516]) * MS
    done = np.array([5, 10, 15, 515, 520, 525, 530]) * MS
    assert full_queue_stalls(sent, done, 3) == (1, 1)
    # with room for one more the same silence is no chance: an arrival could end it
    assert full_queue_stalls(sent, done, 4) == (0, 0)
    # a full queue answered on time is a chance without a stall
    done = np.array([5, 10, 15, 20, 25, 30, 530]) * MS
    assert full_queue_stalls(sent, done, 3) == (0, 1)


def test_timeout_stalls_tell_a_wake_at_the_next_arrival_from_one_at_the_answer():
    # 5 ms executions, 10 ms timeout. At 5 ms the request sent at 4 waits and the next
    # send is at 8: a chance, answered at 10, one execution after 5: the batcher woke. At
    # 10 the one sent at 8 waits, the next send is at 14: a chance, woke (answer at 15).
    # At 15 the one sent at 14 waits, the next send is at 30: a chance, and its answer at
    # 35 is one execution after that send: a stall.
    sent = np.array([0, 4, 8, 14, 30, 31]) * MS
    done = np.array([5, 10, 15, 35, 40, 45]) * MS
    ok = np.ones(6, dtype=bool)
    assert timeout_stalls(sent, done, ok, 5 * MS, 10 * MS) == (1, 3)
    # a next send within STALL_MIN_NS of the answer cannot tell the two apart: with the
    # send at 14 moved to 11, the answer at 10 is no chance
    sent[3] = 11 * MS
    assert timeout_stalls(sent, done, ok, 5 * MS, 10 * MS) == (1, 2)
    # a request past its timeout makes no chance
    assert timeout_stalls(sent, done, ok, 5 * MS, MS // 2) == (0, 0)


@pytest.mark.parametrize("lost", [0.0, 0.06, 0.2])
def test_timeout_stalls_recover_the_simulators_lost_wakeup(lost):
    # the estimator on the simulator's own records, with the share it was given: within
    # three binomial standard errors of it (0 stalls when nothing is lost)
    exec_ms = 5.0
    rng = np.random.default_rng(7)
    arrival = np.cumsum(rng.exponential(exec_ms / 0.9, 12_000) * 1e6).astype(np.int64)
    pol = BatchingPolicy(max_batch_size=1, lost_wakeup=lost,
                         default_timeout_microseconds=10_000)
    r = simulate_policy(arrival, np.array([0.0, exec_ms * 1e6]), np.ones(1), pol, 1, 3)
    stalls, chances = timeout_stalls(r.arrival_ns, r.end_ns, r.status == SERVED,
                                     exec_ms * 1e6, 10 * MS)
    assert chances > 3000
    se = max(np.sqrt(lost * (1 - lost) / chances), 1e-9)
    assert abs(stalls / chances - lost) <= 3 * se
