"""An independent SimPy model of Triton's dynamic batcher: the test oracle and the
benchmark's alternative.

Written in SimPy's own style (processes and callbacks, a float clock) from
the rules in Triton's ``GetDynamicBatch``, not from servelab's engine. Events
at one instant run in SimPy's order: arrivals and instance completions
(normal priority) first, then the batcher's decision, which is scheduled at a
lower priority so that it sees everything that happened at that instant.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import simpy

SERVED, REJECTED, TIMED_OUT = 0, 1, 2
_DECIDE = 2  # after simpy.events.NORMAL (1) at the same instant


def simulate_simpy(arrival_ns: np.ndarray, exec_ns: np.ndarray, multiplier: np.ndarray,
                   preferred: set[int], max_batch_size: int, delay_ns: int, num_instances: int,
                   max_queue_size: int = 0, timeout_ns: int = 0) -> dict[str, np.ndarray]:
    n = len(arrival_ns)
    arrivals = [int(x) for x in arrival_ns]
    status = np.full(n, -1, np.int8)
    start = np.full(n, -1, np.int64)
    end = np.full(n, -1, np.int64)
    prefs = sorted(preferred or {max_batch_size})
    env = simpy.Environment()
    queue: deque[int] = deque()
    idle = list(range(num_instances))
    batches = [0]
    pending_decision = [False]
    timers: set[int] = set()  # future instants a decision is already booked for

    def wake(at: int) -> None:
        if at > env.now:
            if at in timers:
                return
            timers.add(at)
        ev = env.event()
        ev._ok = True
        ev._value = None
        ev.callbacks.append(lambda _ev: decide())
        env.schedule(ev, priority=_DECIDE, delay=at - int(env.now))

    def wake_now() -> None:
        if not pending_decision[0]:
            pending_decision[0] = True
            wake(env.now)

    def finish(instance: int, dur: int):  # type: ignore[no-untyped-def]
        yield env.timeout(dur)
        idle.append(instance)
        idle.sort()
        wake_now()

    def decide() -> None:
        pending_decision[0] = False
        now = int(env.now)
        timers.discard(now)
        while queue and idle:
            pending = min(len(queue), max_batch_size)
            waited = now - arrivals[queue[0]]
            expired = delay_ns > 0 and waited >= delay_ns
            fitting = [p for p in prefs if p <= pending]
            if fitting and not expired:
                size = fitting[-1]
            elif expired or delay_ns == 0:
                size = pending
            else:
                break
            dur = max(1, int(np.rint(exec_ns[size] * multiplier[batches[0]])))
            batches[0] += 1
            instance = idle.pop(0)
            for _ in range(size):
                r = queue.popleft()
                status[r], start[r], end[r] = SERVED, now, now + dur
            env.process(finish(instance, dur))
        while timeout_ns and queue and arrivals[queue[0]] + timeout_ns <= now:
            r = queue.popleft()
            status[r], end[r] = TIMED_OUT, arrivals[r] + timeout_ns
        if queue:
            oldest = arrivals[queue[0]]
            if idle and delay_ns > 0:
                wake(oldest + delay_ns)
            if timeout_ns:
                wake(oldest + timeout_ns)

    def source():  # type: ignore[no-untyped-def]
        for i, t in enumerate(arrivals):
            if t > env.now:
                yield env.timeout(t - env.now)
            if max_queue_size and len(queue) >= max_queue_size:
                status[i], end[i] = REJECTED, t
            else:
                queue.append(i)
            wake_now()

    env.process(source())
    env.run()
    return {"status": status, "start_ns": start, "end_ns": end}
