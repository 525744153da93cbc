"""Triton's dynamic batcher with its batcher thread and payload queue, compiled with Numba.

Triton's one batcher thread per model builds *payloads* and hands them to the
rate limiter even while every instance is busy; an instance takes the oldest
waiting payload when it frees up (a batch does not keep taking arrivals until an
instance starts it: a real Triton's queue said so, docs/load-and-validate.md). This
module models that thread, rule by rule, from triton-inference-server/core
(``src/dynamic_batch_scheduler.cc`` at commit 01ea7d9, ``src/rate_limiter.cc``),
for requests of one row each, no shape checks, no custom batching and one
priority level:

1. **Payload slots** (``RateLimiter::PayloadSlotAvailable``): at most
   ``2 x instances`` payloads wait in the rate limiter's queue. The batcher
   thread blocks (``cv_.wait(lock, wait_for_slots)``) while the queue is full.
   With a queue policy (``max_queue_size`` or a default timeout set) there is
   no prefetching, as in Triton 2.51 (core commit 66c61d2, 2023-08: the
   scheduler's ``SupportPrefetching()`` is false, and ``PayloadSlotAvailable``
   then waits for a consumer): a payload forms only while an instance waits
   for work, so every request not yet executing is in the queue, counts
   against ``max_queue_size`` and can time out.
2. **A new payload** (``BatcherThread``: ``if (payload_saturated_ ||
   IsStaleState(...)) NewPayload(); next_preferred_batch_size_ = 0``) when the
   current one is saturated or an instance has started executing it.
3. **Empty queue**: the thread sleeps ``default_wait_microseconds`` (500 ms).
4. **GetDynamicBatch**, with ``k`` rows already in the current payload and the
   queued requests scanned oldest first:
   - the scan stops before ``k + pending`` would pass ``max_batch_size``
     (``send_now``); it remembers the largest ``pending`` with ``k + pending``
     a preferred size (``best_preferred_batch_size``);
   - with ``k`` already at or past the largest preferred size, the scan marks
     the payload saturated and (``best_preferred_batch_size`` being 0 at the
     first request and 1 at the second) one more request joins it, or all that
     fit once the oldest queued request's delay has expired;
   - a preferred size found and the oldest queued request's delay not
     expired: take exactly that many (saturated when the delay is 0);
   - ``send_now`` or ``k + pending >= max preferred``: take all, saturated;
   - delay expired, or delay 0: take all;
   - otherwise ``next_preferred_batch_size_`` = the next preferred size above
     ``k + pending``, less ``k``; a payload already waiting that is not
     saturated and not of a preferred size takes all at once (it grows);
   - otherwise wait ``delay - age`` in whole microseconds (``wait_ns / 1000``;
     0 means "take all now", so a wake in the last microsecond sends early).
   Taken requests join the current payload; a payload that was empty is handed
   to the rate limiter (``EnqueuePayload``) and the thread loops at once.
5. **Wake-ups** of the sleeping thread: its timer; an arrival, but only when
   a payload slot is free and (the payload is saturated, or started, or the
   queued count has reached ``next_preferred_batch_size_``), as in
   ``Enqueue``; and a payload's completion callback. At a completion the
   instance takes the next waiting payload before the woken thread looks at
   it (the "race" of the issue's traces: the instance usually wins), so the
   thread then starts a new payload and later arrivals wait one more batch.
   ``batcher_first`` is the share of completions at which the thread looks
   first instead (and grows the waiting payload; if that one is full, the thread
   starts a new payload, and the instance takes only once the thread has handed
   requests over or gone back to sleep), drawn per completion from
   the run's seed; ``servelab replay-trace`` fits it to a Triton trace (0.08
   to 0.15 for PyTriton's Triton on a 2-core machine, measured).
6. **The lost wake-up** (opt-in, ``lost_wakeup``; measured, not read from the
   source): without prefetching, Triton 2.51's thread sometimes misses a
   completion's wake-up (it looks before the freed instance waits for work),
   and sleeps on with requests queued until an arrival wakes it or its wait
   ends: 500 ms after it began to wait for an instance. A rejected arrival
   wakes nothing, so with a full queue the instance idles for the rest of
   those 500 ms. On the test's tritonserver (Triton 2.51, Python backend, one
   instance, 4 ms batches, max_queue_size 4, 2-core machine) 5-7% of
   completions with a full queue were followed by such a 500 ms gap, and
   2-5% of those with 1-3 queued by a gap of about one interarrival time.
   ``lost_wakeup`` is the share of completions (with requests queued and no
   prefetching) whose wake-up is missed, drawn from the run's seed.
7. **Payloads merge when an instance takes one** (``InstanceQueue::Dequeue``,
   ``src/instance_queue.cc``): the instance marks the payload executing, then, while
   the next waiting payload's oldest request has waited longer than the delay, marks
   that one executing too and, if the two fit in ``max_batch_size``, takes its
   requests into the batch. A payload the batcher closed at a preferred size below
   ``max_batch_size`` can so run larger than that size. (A current payload marked
   executing without fitting grows no more; the thread starts a new one.)

With no ``preferred_batch_size`` Triton's normaliser uses
``[max_batch_size]``. ``max_queue_size`` counts the requests still in the
queue (not those already in a payload) and rejects at enqueue.
``default_timeout_microseconds`` removes a request still queued at its
deadline (Triton notices at its next scan; requests already in a payload are
executed). Time is integer nanoseconds. At one instant: instances finishing,
arrivals, instances taking waiting payloads, the batcher thread, timeouts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from numba import njit

from servelab.batching.engine import (
    _NEVER,
    DONE,
    MORE_ARRIVALS,
    MORE_ROOM,
    REJECTED,
    S_BLOCK_T,
    S_BLOCKED,
    S_CP_OPEN,
    S_CP_STALE,
    S_HEAD,
    S_LOST,
    S_M_TAIL,
    S_N_BUSY,
    S_N_IDLE,
    S_NB,
    S_NEXT_PREF,
    S_NXT,
    S_RQ_COUNT,
    S_RQ_HEAD,
    S_SATURATED,
    S_SEEDED,
    S_TAIL,
    S_TIMER,
    S_TIMER_IDLE,
    TIMED_OUT,
    heap_pop,
    heap_push,
    start_batch,
)

IDLE_WAIT_NS = 500_000_000  # default_wait_microseconds = 500 * 1000


@njit(cache=True, nogil=True, inline="always")
def _ring(i: int, cap: int) -> int:
    """Index i (0 to 2 * cap - 1) of a ring of cap slots: a compare, where ``i % cap``
    is a division (Python's, with its sign fix-up) that cost 5% of a run."""
    return i - cap if i >= cap else i


@njit(cache=True, nogil=True, inline="always")
def _slot_free(prefetch: bool, rq_count: int, slots: int, n_idle: int) -> bool:
    """May the batcher thread hand over a payload now? With prefetching while fewer than
    `slots` payloads wait; without, while an idle instance has none waiting for it."""
    return rq_count < slots if prefetch else n_idle > rq_count


@njit(cache=True, nogil=True)
def preference_tables(is_pref: np.ndarray, max_batch_size: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """For each size k: the largest preferred size <= k, and the smallest > k (0: none)."""
    floor = np.zeros(max_batch_size + 1, np.int64)
    for b in range(1, max_batch_size + 1):
        floor[b] = b if is_pref[b] else floor[b - 1]
    above = np.zeros(max_batch_size + 2, np.int64)
    for b in range(max_batch_size - 1, -1, -1):
        above[b] = b + 1 if is_pref[b + 1] else above[b + 1]
    return floor, above


@njit(cache=True, nogil=True, inline="always")  # as a call it took 9% of a run
def get_dynamic_batch(q: int, k: int, age_ns: int, is_pref: np.ndarray, pref_floor: np.ndarray,
                      pref_above: np.ndarray, max_pref: int, max_batch_size: int,
                      delay_ns: int, saturated: bool) -> tuple[int, int, bool, int]:
    """Triton's GetDynamicBatch for q queued one-row requests and a payload of k rows.

    Returns (take, wait_us, saturated, next_preferred): ``take`` > 0 means move that
    many requests into the payload now; else ``wait_us`` > 0 is how long to sleep.
    ``next_preferred`` is -1 when the call leaves it unchanged.
    """
    room = max_batch_size - k
    pending = q if q <= room else max(room, 0)
    send_now = q > room
    exceeded = delay_ns > 0 and age_ns >= delay_ns
    if k > 0 and k >= max_pref:
        # The scan's first request already passes the largest preferred size: the payload
        # is saturated, and with best_preferred_batch_size still 0 the next request sets
        # it to 1. So one more request joins (all that fit once the delay has expired).
        if pending == 0:
            return 0, 0, True, -1
        return (pending if exceeded else 1), 0, True, -1
    best = 0
    if pending > 0 and pref_floor[k + pending] > k:
        best = pref_floor[k + pending] - k
    if best > 0 and not exceeded:
        if delay_ns == 0:
            saturated = True
        return best, 0, saturated, -1
    if pending == 0:
        return 0, 0, saturated, -1
    if send_now or k + pending >= max_pref:
        return pending, 0, True, -1
    if exceeded or delay_ns == 0:
        return pending, 0, saturated, -1
    nxt = pref_above[k + pending] - k  # exists: k + pending < max_pref here
    if not saturated and k != 0 and not is_pref[k]:
        return pending, 0, saturated, nxt
    wait_us = (delay_ns - age_ns) // 1000
    if wait_us == 0:
        return pending, 0, saturated, nxt
    return 0, wait_us, saturated, nxt


def get_dynamic_batch_rows(rows: Iterable[int], k: int, age_ns: int, prefs: frozenset[int],
                           max_pref: int, max_batch_size: int, delay_ns: int,
                           saturated: bool) -> tuple[int, int, bool, int]:
    """Triton's GetDynamicBatch counted in rows, as Triton counts it, for queued requests
    of `rows` rows each (in queue order) and a payload of k rows: `get_dynamic_batch`
    where a request may hold more than one row. Same returns, with ``take`` in requests.

    The scan follows Triton's: the first request of an empty payload always joins (a
    request is never larger than max_batch_size: the protocol refuses it); a request
    that would pass the largest preferred size marks the batch saturated and, if no
    preferred size was reached yet, the batch ends before it; one that would pass
    max_batch_size ends the scan and the batch goes now (it waits for the next batch);
    each time the rows reach a preferred size the batch may end there. The scan stops
    at the first request that does not fit, so it reads at most max_batch_size + 1
    requests. On one-row requests it decides exactly as `get_dynamic_batch`
    (tests/unit/test_batch_rows.py)."""
    pending = count = best = best_count = 0
    send_now = False
    for r in rows:
        r = max(1, r)
        if k + count > 0:
            if k + pending + r > max_pref and best == 0:
                best, best_count, saturated = pending, count, True
            if k + pending + r > max_batch_size:
                send_now = True
                break
        pending += r
        count += 1
        if k + pending in prefs:
            best, best_count = pending, count
    exceeded = delay_ns > 0 and age_ns >= delay_ns
    if best > 0 and not exceeded:
        if delay_ns == 0:
            saturated = True
        return best_count, 0, saturated, -1
    if count == 0:
        return 0, 0, saturated, -1
    if send_now or k + pending >= max_pref:
        return count, 0, True, -1
    if exceeded or delay_ns == 0:
        return count, 0, saturated, -1
    nxt = min(p for p in prefs if p > k + pending) - k  # exists: k + pending < max_pref
    if not saturated and k != 0 and k not in prefs:
        return count, 0, saturated, nxt
    wait_us = (delay_ns - age_ns) // 1000
    if wait_us == 0:
        return count, 0, saturated, nxt
    return 0, wait_us, saturated, nxt


@njit(cache=True, nogil=True)
def _quiet_run(arrival_ns: np.ndarray, exec_ns: np.ndarray, multiplier: np.ndarray,
               is_pref: np.ndarray, pref_floor: np.ndarray, pref_above: np.ndarray,
               mbs: int, delay_ns: int, records: tuple[np.ndarray, ...],
               busy_t: np.ndarray, busy_i: np.ndarray, idle_k: np.ndarray, idle_i: np.ndarray,
               n_busy: int, n_idle: int, head: int, nxt: int, nb: int, timer: Any,
               timer_idle: bool, next_pref: int, horizon: Any
               ) -> tuple[int, int, int, int, int, Any, bool, int]:
    """The run an instant at a time while every payload is taken the moment it is handed
    over, without the general loop's cases: the common state of a batcher that keeps up,
    and about twice as fast as the general loop (bench/bench_simulator.py measures it).

    Valid for a policy with no timeout, no queue limit, no batcher-first race, a window
    of at least 1 us and no preferred size below max_batch_size (``quiet`` below), from
    one of two states: nothing queued and the thread asleep on an empty queue, or
    requests queued and the thread waiting for the window to close; the rate limiter's
    queue is empty and the current payload closed in both. Then no request is rejected
    or removed, so the queue holds request ids in order (queue[i] == i, p_head ==
    m_tail == head, tail == nxt) and each instant comes down to: instances finishing
    then arrivals, and the thread, if woken, either waiting for the window or handing
    the whole queue over to an idle instance. Each instant's outcome is worked out by
    Triton's rule (`get_dynamic_batch`) before anything changes, and the run returns
    before an instant that would leave a payload waiting (no instance idle) or requests
    queued behind a full batch, for the general loop to take. Returns the state the
    general loop would have reached (its payload ring's position aside, which only
    matters relative to its head)."""
    status, batch_of, b_size, b_start, b_end, b_inst, queue = records
    n = arrival_ns.size
    while nb < b_size.size:  # out of room: the general loop returns for more
        q = nxt - head
        c = busy_t[0] if n_busy > 0 else _NEVER
        if q > 0:  # arrivals before every other event that do not wake the thread
            before = min(c, timer, horizon)
            while nxt < n and q + 1 < next_pref and arrival_ns[nxt] < before:
                queue[nxt] = nxt
                nxt += 1
                q += 1
        t: Any = arrival_ns[nxt] if nxt < n else _NEVER
        t = min(t, c) if q == 0 else min(t, c, timer)  # asleep on an empty queue: no timer
        if t >= horizon:  # the end, or an instant the general loop must stop before
            break
        arrived = 0  # arrivals at this instant
        while nxt + arrived < n and arrival_ns[nxt + arrived] == t:
            arrived += 1
        q_now = q + arrived
        if not (c == t or (q > 0 and timer == t) or (arrived > 0 and q_now >= next_pref)):
            for j in range(nxt, nxt + arrived):  # arrivals that only join the queue
                queue[j] = j
            nxt += arrived
            continue
        take = 0
        wait_us = 0
        np_ = 0
        if q_now > 0:  # the thread looks at the queue (else it goes back to sleep)
            age = t - (arrival_ns[head] if q > 0 else t)
            take, wait_us, _, np_ = get_dynamic_batch(q_now, 0, age, is_pref, pref_floor,
                                                      pref_above, mbs, mbs, delay_ns, False)
            if take > 0 and (take < q_now or (n_idle == 0 and c != t)):
                break  # requests left queued, or a payload left waiting: the general loop
            if take == 0 and wait_us == 0:
                break
        while n_busy > 0 and busy_t[0] <= t:  # the instant: instances finishing...
            k_inst = heap_pop(busy_t, busy_i, n_busy)
            n_busy -= 1
            heap_push(idle_k, idle_i, n_idle, k_inst, k_inst)
            n_idle += 1
        for j in range(nxt, nxt + arrived):  # ...then arrivals...
            queue[j] = j
        nxt += arrived
        if take > 0:  # ...then the thread: the queue to the idle instance, lowest first
            inst = heap_pop(idle_k, idle_i, n_idle)
            n_idle -= 1
            done = start_batch(t, queue, head, take, nb, inst, exec_ns, multiplier,
                               status, batch_of, b_size, b_start, b_end, b_inst)
            heap_push(busy_t, busy_i, n_busy, done, inst)
            n_busy += 1
            nb += 1
            head += take
        if wait_us > 0:  # the window stays open
            timer = t + wait_us * 1000
            timer_idle = False
            next_pref = np_
        else:  # a new payload (NewPayload) and an empty queue: sleep
            timer = t + IDLE_WAIT_NS
            timer_idle = True
            next_pref = 0
    return n_busy, n_idle, head, nxt, nb, timer, timer_idle, next_pref


@njit(cache=True, nogil=True)
def run_batcher_triton(
    arrival_ns: np.ndarray,
    exec_ns: np.ndarray,
    multiplier: np.ndarray,
    preferred: np.ndarray,
    max_batch_size: int,
    delay_ns: int,
    num_instances: int,
    max_queue_size: int,
    timeout_ns: int,
    records: tuple[np.ndarray, ...],
    state: tuple[np.ndarray, ...],
    limit: int,
    batcher_first: float = 0.0,
    seed: int = 0,
    lost_wakeup: float = 0.0,
) -> int:
    """Run Triton's batcher thread over sorted arrivals, as far as the first `limit` of
    them allow.

    ``exec_ns[b]`` is the mean execution time of a batch of b rows; the k-th batch
    dispatched takes ``exec_ns[b] * multiplier[k]`` (at least 1 ns). ``preferred[b]`` is
    True for each preferred batch size. ``records`` is ``engine.new_records(n,
    batch_cap)``, filled in here: per request its status and batch (-1 unless served),
    per batch its size, start_ns, end_ns and instance. A request's start and end are its
    batch's (see ``simulate.Records``). Request ids (int32) must be below 2**31.

    ``state`` is ``engine.new_state(num_instances)`` before the first call, and carries
    the run from one call to the next. A call returns DONE when the run is over;
    MORE_ARRIVALS before the first instant at or after arrival ``limit - 1`` (arrivals
    past `limit` may not be drawn yet: the caller calls again with more); MORE_ROOM when
    the records may not hold the next instant's batches (call again with
    ``engine.more_room(records)``). The number of batches is ``state[0][S_NB]``.

    ``batcher_first`` is the share of completions at which the woken batcher thread
    looks before the freed instance takes the next waiting payload (drawn from `seed`
    by Numba's generator, whose state is the calling thread's: make every call of one
    run from the same thread); 0 is the order the source implies. ``lost_wakeup`` is the
    share of completions whose wake-up the thread misses when it waits for an instance
    without prefetching (see rule 6), drawn from the same generator."""
    n = arrival_ns.size
    mbs = max_batch_size
    is_pref = preferred.copy()
    pref_floor, pref_above = preference_tables(is_pref, mbs)
    max_pref = pref_floor[mbs]

    status, batch_of, b_size, b_start, b_end, b_inst, queue = records
    batch_cap = b_size.size
    # Instances: a heap of the busy ones by (free time, index), of the idle by index.
    # Request ids in arrival order: queue[p_head:tail] is the batcher's queue (not yet in
    # a payload). Requests taken into payloads are moved down to queue[:m_tail], in the
    # order they joined, each payload a segment there (the current one always the last):
    # m_tail <= p_head always, so the move never overwrites a queued request. The rate
    # limiter's payload queue is a ring of (start, length), rq_count of them from rq_head.
    st, busy_t, busy_i, idle_k, idle_i, seg_start, seg_len = state
    n_busy, n_idle = st[S_N_BUSY], st[S_N_IDLE]
    p_head, tail, m_tail, nxt, nb = st[S_HEAD], st[S_TAIL], st[S_M_TAIL], st[S_NXT], st[S_NB]
    rq_head, rq_count = st[S_RQ_HEAD], st[S_RQ_COUNT]
    cp_open = st[S_CP_OPEN] != 0  # the current payload is in the rate limiter's queue
    cp_stale = st[S_CP_STALE] != 0  # an instance has started the current payload
    saturated = st[S_SATURATED] != 0
    next_pref = st[S_NEXT_PREF]
    timer = st[S_TIMER]  # the thread's next timed wake-up (it starts asleep, queue empty)
    timer_idle = st[S_TIMER_IDLE] != 0  # that sleep is the 500 ms empty-queue wait
    blocked = st[S_BLOCKED] != 0  # waiting for a payload slot (no timer)
    block_t = st[S_BLOCK_T]  # when it began to wait
    lost = st[S_LOST]  # a missed wake-up: the end of that wait's 500 ms, or _NEVER
    slots = 2 * num_instances
    cap = slots + 1
    prefetch = max_queue_size == 0 and timeout_ns == 0  # (see rule 1)
    horizon = _NEVER if limit >= n else arrival_ns[limit - 1]
    if (batcher_first > 0.0 or lost_wakeup > 0.0) and st[S_SEEDED] == 0:
        np.random.seed(seed)
        st[S_SEEDED] = 1
    # The policies `_quiet_run` takes whenever the state allows (see there).
    quiet = (timeout_ns == 0 and max_queue_size == 0 and batcher_first == 0.0
             and delay_ns >= 1000 and mbs >= 2 and pref_floor[mbs - 1] == 0)

    while True:
        if batch_cap - nb < num_instances:  # room for as many batches as instances
            code = MORE_ROOM
            break
        if (quiet and rq_count == 0 and not (blocked or saturated or cp_stale or cp_open)
                and m_tail == p_head and tail == nxt
                and ((tail == p_head and timer_idle and next_pref == 0)
                     or (tail > p_head and not timer_idle and next_pref == mbs))):
            n_busy, n_idle, p_head, nxt, nb, timer, timer_idle, next_pref = _quiet_run(
                arrival_ns, exec_ns, multiplier, is_pref, pref_floor, pref_above, mbs,
                delay_ns, records, busy_t, busy_i, idle_k, idle_i, n_busy, n_idle, p_head,
                nxt, nb, timer, timer_idle, next_pref, horizon)
            m_tail = p_head
            tail = nxt
            if batch_cap - nb < num_instances:  # it may have used the room up
                code = MORE_ROOM
                break
        if nxt < n and (blocked or not timer_idle):
            # Arrivals that only join the queue, enqueued in a tight loop: those before
            # every other event (a completion, the thread's timer, the head's deadline)
            # that neither wake the thread (the wake rule below) nor meet a full queue.
            # The thread is then waiting on a timer or blocked, so nothing else can happen
            # at them: the state at the next event is what one step each would leave.
            other = horizon
            if n_busy > 0:
                other = min(other, busy_t[0])
            if not blocked:
                other = min(other, timer)
            other = min(other, lost)
            if timeout_ns > 0 and tail > p_head:
                other = min(other, arrival_ns[queue[p_head]] + timeout_ns)
            while nxt < n and arrival_ns[nxt] < other:
                if max_queue_size > 0 and tail - p_head >= max_queue_size:
                    break
                if (_slot_free(prefetch, rq_count, slots, n_idle)
                        and (saturated or cp_stale or tail + 1 - p_head >= next_pref)):
                    break
                if timeout_ns > 0 and tail == p_head:  # a new head: its deadline counts
                    other = min(other, arrival_ns[nxt] + timeout_ns)
                queue[tail] = nxt
                tail += 1
                nxt += 1
        q = tail - p_head
        t = _NEVER
        if nxt < n:
            t = arrival_ns[nxt]
        if n_busy > 0:
            t = min(t, busy_t[0])
        if not blocked and (q > 0 or not timer_idle):
            t = min(t, timer)
        t = min(t, lost)
        if q > 0 and timeout_ns > 0:
            t = min(t, arrival_ns[queue[p_head]] + timeout_ns)
        if t >= horizon:
            code = DONE if t == _NEVER else MORE_ARRIVALS
            break

        wake = False
        completed = False
        while n_busy > 0 and busy_t[0] <= t:  # completions: the callback wakes the thread
            k_inst = heap_pop(busy_t, busy_i, n_busy)
            n_busy -= 1
            heap_push(idle_k, idle_i, n_idle, k_inst, k_inst)
            n_idle += 1
            if (lost_wakeup > 0.0 and not prefetch and (blocked or tail > p_head)
                    and not wake and (lost_wakeup >= 1.0 or np.random.random() < lost_wakeup)):
                # (rule 6) the thread looked before the instance waited for work: it
                # sleeps on until a waking arrival or the end of its 500 ms wait (its
                # own timer when it sleeps on one)
                if blocked and lost == _NEVER:
                    lost = block_t + ((t - block_t) // IDLE_WAIT_NS + 1) * IDLE_WAIT_NS
                continue
            wake = True
            completed = True

        while nxt < n and arrival_ns[nxt] <= t:
            if max_queue_size > 0 and tail - p_head >= max_queue_size:
                status[nxt] = REJECTED
                batch_of[nxt] = -1
            else:
                queue[tail] = nxt
                tail += 1
                if (_slot_free(prefetch, rq_count, slots, n_idle)
                        and (saturated or cp_stale or tail - p_head >= next_pref)):
                    wake = True
            nxt += 1
        if timer_idle and not blocked and tail > p_head and timer < t:
            # The thread woke every 500 ms on an empty queue; its next wake is the
            # first of those at or after now.
            timer += ((t - timer + IDLE_WAIT_NS - 1) // IDLE_WAIT_NS) * IDLE_WAIT_NS
        if not blocked and timer <= t and (tail > p_head or not timer_idle):
            wake = True
        if lost <= t:
            wake = True
        if wake:
            lost = _NEVER

        # The batcher thread runs (after instances took what was waiting), looping
        # until it sleeps or blocks; each payload it hands over is taken by an
        # idle instance at once. At a completion the thread may win the race and look
        # first (``batcher_first``), growing the waiting payload before it is taken.
        head_start = (completed and batcher_first > 0.0
                      and _slot_free(prefetch, rq_count, slots, n_idle)
                      and (batcher_first >= 1.0 or np.random.random() < batcher_first))
        running = True
        while True:
            # The head start lasts while the thread loops without handing anything over
            # (a pass that only starts a new payload): it ends when the thread takes
            # requests or stops.
            if not (head_start and running):
                while n_idle > 0 and rq_count > 0:
                    s0 = seg_start[rq_head]
                    size = seg_len[rq_head]
                    if rq_count == 1 and cp_open:
                        cp_open = False
                        cp_stale = True
                    rq_head = _ring(rq_head + 1, cap)
                    rq_count -= 1
                    # (rule 7) payloads behind it whose oldest request has waited past
                    # the delay join it while they fit; each one looked at is marked
                    # executing, so a current payload that does not fit grows no more
                    while rq_count > 0 and delay_ns > 0 and mbs > 1:
                        if t - arrival_ns[queue[seg_start[rq_head]]] <= delay_ns:
                            break
                        if rq_count == 1 and cp_open:
                            cp_open = False
                            cp_stale = True
                        if size + seg_len[rq_head] > mbs:
                            break
                        size += seg_len[rq_head]  # the next segment of queue[:m_tail]
                        rq_head = _ring(rq_head + 1, cap)
                        rq_count -= 1
                    inst = heap_pop(idle_k, idle_i, n_idle)
                    n_idle -= 1
                    done = start_batch(t, queue, s0, size, nb, inst, exec_ns, multiplier,
                                       status, batch_of, b_size, b_start, b_end, b_inst)
                    heap_push(busy_t, busy_i, n_busy, done, inst)
                    n_busy += 1
                    nb += 1
            if not running:
                break
            if not wake or (blocked and not _slot_free(prefetch, rq_count, slots, n_idle)):
                running = False
                continue
            if saturated or cp_stale:  # NewPayload()
                cp_open = False
                cp_stale = False
                saturated = False
                next_pref = 0
            q = tail - p_head
            if q == 0:
                timer = t + IDLE_WAIT_NS
                timer_idle = True
                blocked = False
                running = False
                continue
            if not _slot_free(prefetch, rq_count, slots, n_idle):
                if not blocked:
                    block_t = t
                blocked = True
                running = False
                continue
            blocked = False
            k = seg_len[_ring(rq_head + rq_count - 1, cap)] if cp_open else 0
            take, wait_us, saturated, np_ = get_dynamic_batch(
                q, k, t - arrival_ns[queue[p_head]], is_pref, pref_floor, pref_above,
                max_pref, mbs, delay_ns, saturated)
            if np_ >= 0:
                next_pref = np_
            if take > 0:
                if cp_open:
                    seg_len[_ring(rq_head + rq_count - 1, cap)] += take
                else:
                    slot = _ring(rq_head + rq_count, cap)
                    seg_start[slot] = m_tail
                    seg_len[slot] = take
                    rq_count += 1
                    cp_open = True
                for j in range(take):  # ascending: safe where the two ranges overlap
                    queue[m_tail + j] = queue[p_head + j]
                m_tail += take
                p_head += take
                head_start = False
                continue
            if wait_us > 0:
                timer = t + wait_us * 1000
                timer_idle = False
                running = False
                continue
            if not saturated:  # nothing to take and nothing to wait for: sleep
                timer = t + IDLE_WAIT_NS
                timer_idle = True
                running = False
                continue

        if timeout_ns > 0:
            while tail > p_head and arrival_ns[queue[p_head]] + timeout_ns <= t:
                status[queue[p_head]] = TIMED_OUT
                batch_of[queue[p_head]] = -1
                p_head += 1

    st[S_N_BUSY], st[S_N_IDLE] = n_busy, n_idle
    st[S_HEAD], st[S_TAIL], st[S_M_TAIL], st[S_NXT], st[S_NB] = p_head, tail, m_tail, nxt, nb
    st[S_RQ_HEAD], st[S_RQ_COUNT] = rq_head, rq_count
    st[S_CP_OPEN], st[S_CP_STALE], st[S_SATURATED] = cp_open, cp_stale, saturated
    st[S_NEXT_PREF], st[S_TIMER], st[S_TIMER_IDLE], st[S_BLOCKED] = (next_pref, timer,
                                                                     timer_idle, blocked)
    st[S_BLOCK_T], st[S_LOST] = block_t, lost
    return code
