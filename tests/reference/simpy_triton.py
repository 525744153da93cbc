"""An independent SimPy model of Triton's batcher thread and payload queue: the oracle
for ``servelab.batching.triton_engine``.

Written as Triton's code is: one batcher process looping like
``DynamicBatchScheduler::BatcherThread`` and waiting on a condition variable with
a timeout, ``GetDynamicBatch`` as the literal scan over the queue (cursor, mark,
``best_preferred_batch_size``, ``payload_saturated_``), and the rate limiter's
payload queue with ``2 x instances`` slots, or, with a queue policy (a queue limit or
a timeout), none: a payload forms only while an instance is idle, as Triton 2.51 does
it. It shares no code with the engine.

Order at one instant, as the engine documents it: instance completions and
arrivals (SimPy's normal priority), then the batcher thread (lower priority),
then timeouts (lowest). An instance that finishes takes the next waiting payload
before the woken thread runs; with ``batcher_first`` the thread runs first (after the
instant's arrivals, while a payload slot is free) and the instance takes the payload
once the thread has grown it or gone back to sleep. An instance that takes a payload
merges the ones behind it that waited past the delay and fit
(``InstanceQueue::Dequeue``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import simpy

SERVED, REJECTED, TIMED_OUT = 0, 1, 2
_THREAD, _TIMEOUTS = 2, 3  # priorities after simpy's NORMAL (1) at one instant
IDLE_WAIT_NS = 500_000_000


@dataclass
class Payload:
    requests: list[int] = field(default_factory=list)
    state: str = "uninitialized"  # -> "requested" (in the rate limiter) -> "executing"


def simulate_simpy_triton(arrival_ns: np.ndarray, exec_ns: np.ndarray, multiplier: np.ndarray,
                          preferred: set[int], max_batch_size: int, delay_ns: int,
                          num_instances: int, max_queue_size: int = 0,
                          timeout_ns: int = 0, batcher_first: bool = False
                          ) -> dict[str, np.ndarray]:
    n = len(arrival_ns)
    arrivals = [int(x) for x in arrival_ns]
    status = np.full(n, -1, np.int8)
    start = np.full(n, -1, np.int64)
    end = np.full(n, -1, np.int64)
    prefs = set(preferred or {max_batch_size})
    max_pref = max(prefs)
    env = simpy.Environment()
    queue: deque[int] = deque()  # requests not yet in a payload
    rate_limiter: deque[Payload] = deque()
    idle = list(range(num_instances))
    batches = [0]
    st = {"payload": Payload(), "saturated": False, "next_pref": 0, "pending": 0}
    thread = {"waiting": False, "deadline": None, "token": 0}
    done = [False]  # every arrival has come
    take_after_thread = [False]  # an instance freed while the thread looks first

    # -- the condition variable: a notify wakes the thread (at thread priority) --------
    def schedule_run(at: int, token: int) -> None:
        ev = env.event()
        ev._ok = True
        ev._value = None
        ev.callbacks.append(lambda _e: run_thread(token))
        env.schedule(ev, priority=_THREAD, delay=at - int(env.now))

    def notify() -> None:
        if thread["waiting"]:
            thread["waiting"] = False
            thread["token"] += 1
            schedule_run(int(env.now), thread["token"])

    def sleep(timeout: int | None) -> None:
        thread["waiting"] = True
        thread["token"] += 1
        quiet = done[0] and not queue and not rate_limiter and len(idle) == num_instances
        if timeout is not None and not quiet:  # nothing left to happen: stop the clock
            schedule_run(int(env.now) + timeout, thread["token"])

    # Triton 2.51 prefetches only without a queue policy (core 66c61d2); without
    # prefetching, PayloadSlotAvailable waits for a consumer: an idle instance.
    prefetch = max_queue_size == 0 and timeout_ns == 0

    def slot_available() -> bool:
        if prefetch:
            return len(rate_limiter) < 2 * num_instances
        return len(idle) > len(rate_limiter)

    # -- instances ----------------------------------------------------------------------
    def take_waiting() -> None:
        while idle and rate_limiter:
            p = rate_limiter.popleft()
            p.state = "executing"
            now = int(env.now)
            # InstanceQueue::Dequeue: while the next payload's oldest request has waited
            # past the delay, mark it executing and, if it fits, merge it into this one
            while rate_limiter and delay_ns > 0 and max_batch_size > 1:
                front = rate_limiter[0]
                if now - arrivals[front.requests[0]] <= delay_ns:
                    break
                front.state = "executing"
                if len(p.requests) + len(front.requests) > max_batch_size:
                    break
                p.requests = p.requests + front.requests
                rate_limiter.popleft()
            inst = idle.pop(0)
            size = len(p.requests)
            dur = max(1, int(np.rint(exec_ns[size] * multiplier[batches[0]])))
            batches[0] += 1
            for r in p.requests:
                status[r], start[r], end[r] = SERVED, now, now + dur
            env.process(execute(inst, dur))

    def execute(inst: int, dur: int):  # type: ignore[no-untyped-def]
        yield env.timeout(dur)
        idle.append(inst)
        idle.sort()
        if batcher_first and slot_available():
            take_after_thread[0] = True  # the thread wins the race: it looks first
            notify()
            return
        take_waiting()  # the instance wins the race with the callback below
        notify()  # the payload's completion callback

    # -- GetDynamicBatch, as the scan over the queue ------------------------------------
    def get_dynamic_batch() -> int:
        """Sets st["pending"] (how many queued requests to take); returns wait in us."""
        k = len(st["payload"].requests)
        pending = 0
        best = 0
        mark = 0
        send_now = False
        for _r in queue:
            if k + pending != 0:
                if k + pending + 1 > max_pref and best == 0:
                    best = pending
                    mark = pending
                    st["saturated"] = True
                if k + pending + 1 > max_batch_size:
                    send_now = True
                    break
            pending += 1
            if (pending + k) in prefs:
                best = pending
                mark = pending
        now = int(env.now)
        age = now - arrivals[queue[0]]
        exceeded = delay_ns != 0 and age >= delay_ns
        if best != 0 and not exceeded:
            if delay_ns == 0:
                st["saturated"] = True
            st["pending"] = mark
            return 0
        st["pending"] = pending
        if pending == 0:
            return 0
        if send_now or k + pending >= max_pref:
            st["saturated"] = True
            return 0
        if exceeded or delay_ns == 0:
            return 0
        above = [p for p in sorted(prefs) if p > pending + k]
        nxt = above[0] if above else min(prefs)
        st["next_pref"] = nxt - k
        if not st["saturated"] and k != 0 and k not in prefs:
            return 0
        return (delay_ns - age) // 1000

    # -- the batcher thread: one loop iteration per run --------------------------------
    def first_take() -> None:  # the instances freed while the thread looked first
        if take_after_thread[0]:
            take_after_thread[0] = False
            take_waiting()

    def run_thread(token: int) -> None:
        if token != thread["token"]:
            return  # a stale timer: the thread was woken since
        thread["waiting"] = False
        thread_loop()
        first_take()

    def thread_loop() -> None:
        while True:
            p = st["payload"]
            if st["saturated"] or p.state == "executing":
                st["payload"] = Payload()
                st["saturated"] = False
                st["next_pref"] = 0
            if not queue:
                sleep(IDLE_WAIT_NS)
                return
            if not slot_available():
                sleep(None)  # cv_.wait(lock, wait_for_slots): only a notify wakes it
                return
            wait_us = get_dynamic_batch()
            take = st["pending"]
            if wait_us == 0 and take > 0:
                p = st["payload"]
                for _ in range(take):
                    p.requests.append(queue.popleft())
                if p.state == "uninitialized":
                    p.state = "requested"
                    rate_limiter.append(p)
                    take_waiting()
                first_take()
                continue
            if wait_us > 0:
                sleep(wait_us * 1000)
                return
            if not st["saturated"]:
                sleep(IDLE_WAIT_NS)
                return

    # -- arrivals and timeouts ---------------------------------------------------------
    def expire(i: int):  # type: ignore[no-untyped-def]
        yield env.timeout(timeout_ns)
        ev = env.event()
        ev._ok = True
        ev._value = None
        ev.callbacks.append(lambda _e: drop(i))
        env.schedule(ev, priority=_TIMEOUTS, delay=0)

    def drop(i: int) -> None:
        if i in queue:
            # FIFO with one timeout for all: the expired request is at the head.
            assert queue[0] == i
            queue.popleft()
            status[i], end[i] = TIMED_OUT, arrivals[i] + timeout_ns

    def source():  # type: ignore[no-untyped-def]
        for i, t in enumerate(arrivals):
            if t > env.now:
                yield env.timeout(t - env.now)
            if max_queue_size and len(queue) >= max_queue_size:
                status[i], end[i] = REJECTED, t
                continue
            queue.append(i)
            if timeout_ns:
                env.process(expire(i))
            p = st["payload"]
            if slot_available() and (st["saturated"] or p.state == "executing"
                                     or len(queue) >= st["next_pref"]):
                notify()
        done[0] = True

    sleep(IDLE_WAIT_NS)  # the thread starts on an empty queue
    env.process(source())
    env.run()
    return {"status": status, "start_ns": start, "end_ns": end}
