"""Triton's batch-closing rule (closing = "triton", the only one), case by case, with the
times worked out by hand from dynamic_batch_scheduler.cc (see triton_engine's docstring).

Every case uses one instance, a 10 ms batch (so the instance stays busy), a 2 ms
max_queue_delay and max_batch_size 32 unless it says otherwise."""

from __future__ import annotations

import numpy as np

from servelab.batching.engine import REJECTED, SERVED
from servelab.batching.state import BatcherCore, Payload
from servelab.scenario import BatchingPolicy
from tests.conftest import MS, run_ms


def starts_ms(r):  # type: ignore[no-untyped-def]
    return [int(s) / MS for s in r.start_ns]


def sizes(r):  # type: ignore[no-untyped-def]
    return r.batch_size.tolist()


def triton(arrivals, exec_ms=10.0, **policy):  # type: ignore[no-untyped-def]
    policy.setdefault("max_batch_size", 32)
    policy.setdefault("max_queue_delay_microseconds", 2000)
    return run_ms(arrivals, exec_ms, **policy)


def test_a_batch_closes_at_its_delay_while_the_instance_is_busy():
    # 0: waits its 2 ms with the instance idle, runs 2-12 ms.
    # 3, 4: the thread arms a timer at 3 + 2 = 5 ms (the arrival at 3 wakes it: the last
    #   payload was started, so next_preferred is 0); at 5 ms the delay has expired and
    #   [3, 4] closes into a payload that waits for the busy instance.
    # 6: next_preferred is 32 now, so this arrival does not wake the thread; at 12 ms the
    #   instance takes [3, 4] first, then the woken thread closes [6] (its delay expired
    #   at 8 ms), which waits for the next batch: 22 ms.
    r = triton([0, 3, 4, 6])
    assert starts_ms(r) == [2.0, 12.0, 12.0, 22.0]  # 6 does not join [3, 4] at 12 ms
    assert sizes(r) == [1, 2, 1]


def test_an_arrival_just_after_closing_waits_one_batch():
    # 0 goes alone at 2 ms (instance idle) and runs to 12 ms. 3 closes at 5 ms while the
    # instance is busy. An arrival 1 ns after that close does not wake the thread
    # (next_preferred is 32) and is closed only when the instance takes [3] at 12 ms:
    # it starts a full batch later, at 22 ms.
    assert starts_ms(triton([0, 3, 5 + 1e-6])) == [2.0, 12.0, 22.0]
    # One that arrives at the very instant of the close joins it (at one instant the
    # arrivals come before the batcher thread).
    at_close = triton([0, 3, 5.0])
    assert starts_ms(at_close) == [2.0, 12.0, 12.0]


def test_a_batcher_that_wins_the_race_grows_the_waiting_payload():
    # As test_an_arrival_just_after_closing_waits_one_batch: [3] closed at 5 ms and waits
    # for the instance, busy until 12 ms; 6 arrives after the close. If the woken batcher
    # thread looks before the instance takes [3] (batcher_first = 1), the waiting payload
    # is not stale yet and takes 6 at once (it grows): both start at 12 ms. Otherwise
    # (batcher_first = 0, the order the source implies) 6 waits a batch.
    instance_first = run_ms([0, 3, 6], 10.0, max_batch_size=32,
                            max_queue_delay_microseconds=2000, batcher_first=0.0)
    batcher_first = run_ms([0, 3, 6], 10.0, max_batch_size=32,
                           max_queue_delay_microseconds=2000, batcher_first=1.0)
    assert starts_ms(instance_first) == [2.0, 12.0, 22.0]
    assert starts_ms(batcher_first) == [2.0, 12.0, 12.0]
    assert sizes(batcher_first) == [1, 2]
    # Between the two, the share of races the batcher wins moves the run between them;
    # the same seed gives the same run.
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(2.0, 4000)).tolist()  # 500/s against 10 ms batches
    queue = []
    for share in (0.0, 0.3, 1.0):
        r = run_ms(arrivals, [4.0 + 0.2 * b for b in range(1, 33)], max_batch_size=32,
                   max_queue_delay_microseconds=2000, batcher_first=share)
        queue.append(float((r.start_ns - r.arrival_ns).mean()))
    assert queue[0] > queue[1] > queue[2]
    again = run_ms(arrivals, [4.0 + 0.2 * b for b in range(1, 33)], max_batch_size=32,
                   max_queue_delay_microseconds=2000, batcher_first=0.3)
    assert float((again.start_ns - again.arrival_ns).mean()) == queue[1]


def test_a_batcher_that_wins_the_race_runs_until_it_hands_a_payload_over():
    # max_batch_size 2, a 0.1 ms delay, 1 ms batches, batcher_first = 1.
    # [0, 0] runs 0-1 ms. 0.5 and 0.55 make 2, a preferred size: payload [0.5, 0.55]
    #   closes at 0.55 ms and waits (not saturated: it reached its size before the delay).
    # 0.85 does not wake the thread (next_preferred is 2).
    # 1 ms: the instance is freed and the thread looks first. The waiting payload is full,
    #   so the thread starts a new one, and 0.85 (past its delay) goes into it at once and
    #   is handed over; only then does the instance take [0.5, 0.55]. Taking it, the
    #   instance finds [0.85] waited past the delay and marks it executing, though it does
    #   not fit (InstanceQueue::Dequeue), so [0.85] grows no more.
    # 1.05, 1.05 then start a payload of their own: [0.85] runs alone at 2 ms, they at 3.
    # (Had the head start ended after the thread's first pass, the instance would take
    # [0.5, 0.55] before [0.85] was handed over, and 1.05 would join [0.85].)
    r = run_ms([0, 0, 0.5, 0.55, 0.85, 1.05, 1.05], 1.0, max_batch_size=2,
               max_queue_delay_microseconds=100, batcher_first=1.0)
    assert starts_ms(r) == [0.0, 0.0, 1.0, 1.0, 2.0, 3.0, 3.0]
    assert sizes(r) == [2, 2, 1, 2]


def test_a_preferred_size_reached_while_busy_closes_at_once():
    # max_batch_size 4 (so preferred = [4]) and a 100 ms delay. The instance is idle until
    # 0, 1, 2, 3 ms make four: they start at 3 ms and run to 13 ms. 4..7 ms reach
    # next_preferred (4) at 7 ms, which wakes the thread: a full payload that closes at
    # once and waits for 13 ms. 8 ms is alone; it waits for its own delay (108 ms).
    arrivals = [0, 1, 2, 3, 4, 5, 6, 7, 8]
    r = run_ms(arrivals, 10.0, max_batch_size=4,
           max_queue_delay_microseconds=100_000)
    assert sizes(r) == [4, 4, 1]
    assert starts_ms(r) == [3.0] * 4 + [13.0] * 4 + [108.0]


def test_a_waiting_payload_of_the_largest_preferred_size_takes_one_more():
    # preferred [2] of max_batch_size 8, delay 100 ms. [0, 1] starts at 1 ms (to 11 ms).
    # [2, 3] reaches the preferred size at 3 ms and closes into a waiting payload. At 5 ms
    # two requests are queued, which reaches next_preferred (2) and wakes the thread. The
    # waiting payload already holds the largest preferred size, so GetDynamicBatch marks
    # it saturated and (best_preferred_batch_size is 0 at the scan's first request, so
    # the second sets it to 1) takes one more: [2, 3, 4]. 5 then waits for its own delay.
    arrivals = [0, 1, 2, 3, 4, 5]
    r = run_ms(arrivals, 10.0, max_batch_size=8,
           preferred_batch_size=(2,), max_queue_delay_microseconds=100_000)
    assert sizes(r) == [2, 3, 1]
    assert starts_ms(r) == [1.0, 1.0, 11.0, 11.0, 11.0, 105.0]


def test_with_a_queue_limit_nothing_waits_outside_the_queue():
    # max_batch_size 1: every arrival is a full payload. With a queue policy Triton 2.51
    # does not prefetch: a payload forms only while the instance waits for work. So 0
    # runs, 0.1 is queued (the limit is 1) and 0.2 to 0.5 are rejected. (Before core
    # 66c61d2 two payloads waited beside the queue: 0.1 and 0.2 in payloads, 0.3 queued.)
    arrivals = [0, 0.1, 0.2, 0.3, 0.4, 0.5]
    r = run_ms(arrivals, 10.0, max_batch_size=1, max_queue_size=1)
    assert r.status.tolist() == [SERVED, SERVED] + [REJECTED] * 4
    assert starts_ms(r)[:2] == [0.0, 10.0]


def test_a_lost_wake_up_with_a_full_queue_idles_the_instance_500_ms():
    # max_batch_size 1, max_queue_size 2, every wake-up at a completion lost (rule 6):
    # 0 runs 0-10; 1 and 2 queue; 3 is rejected (full). At 10 the thread, waiting for an
    # instance since 0, misses the wake-up, and the rejected 40 wakes nothing: it wakes
    # when its wait ends, 500 ms after it began (0), and starts 1. Waiting again since
    # 500, it misses the next one too: 2 starts at 1000. Without the loss: 10 and 20.
    arrivals = [0, 1, 2, 3, 40]
    policy = {"max_batch_size": 1, "max_queue_size": 2}
    lost = run_ms(arrivals, 10.0, lost_wakeup=1.0, **policy)
    assert lost.status.tolist() == [SERVED, SERVED, SERVED, REJECTED, REJECTED]
    assert starts_ms(lost)[:3] == [0.0, 500.0, 1000.0]
    kept = run_ms(arrivals, 10.0, **policy)
    assert kept.status.tolist() == [SERVED, SERVED, SERVED, REJECTED, SERVED]
    assert starts_ms(kept)[:3] == [0.0, 10.0, 20.0]


def test_a_lost_wake_up_ends_at_the_next_accepted_arrival():
    # The same with room in the queue (max_queue_size 4): the arrival at 30 is accepted,
    # and wakes the thread (the instance is free), which starts 1 at once.
    r = run_ms([0, 1, 2, 30], 10.0, lost_wakeup=1.0, max_batch_size=1, max_queue_size=4)
    assert r.status.tolist() == [SERVED] * 4
    assert starts_ms(r)[:2] == [0.0, 30.0]


def test_a_lost_wake_up_needs_no_prefetching():
    # Without a queue policy Triton prefetches: payloads wait for the instance, which
    # takes the next at its completion whatever the thread does, so nothing is lost.
    arrivals = [0, 1, 2, 3]
    assert (starts_ms(run_ms(arrivals, 10.0, lost_wakeup=1.0, max_batch_size=1))
            == starts_ms(run_ms(arrivals, 10.0, max_batch_size=1)) == [0.0, 10.0, 20.0, 30.0])


def test_without_a_queue_policy_two_payloads_per_instance_wait():
    # The same arrivals without a queue policy: the batcher hands two payloads over
    # while the instance runs the first, then blocks on the payload slot.
    started: list[Payload[int]] = []
    core: BatcherCore[int] = BatcherCore(BatchingPolicy(max_batch_size=1), 1, started.append)
    for i in range(6):
        assert core.arrive(i, i * 100_000)
        core.step(i * 100_000)
    assert [p.items for p in started] == [[0]]
    assert [p.items for p in core.waiting] == [[1], [2]]
    assert [item for item, _, _ in core.queue] == [3, 4, 5]
    limited: list[Payload[int]] = []
    core = BatcherCore(BatchingPolicy(max_batch_size=1, max_queue_size=8), 1, limited.append)
    for i in range(6):
        assert core.arrive(i, i * 100_000)
        core.step(i * 100_000)
    assert not core.waiting
    assert len(core.queue) == 5


def test_at_low_load_each_batch_goes_at_its_oldest_requests_delay():
    # With the instance idle whenever a batch forms, nothing waits for a busy instance.
    arrivals = [0, 0.5, 1, 20, 20.5, 40]
    assert starts_ms(triton(arrivals, exec_ms=1.0)) == [2.0, 2.0, 2.0, 22.0, 22.0, 42.0]
