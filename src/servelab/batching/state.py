"""Triton's dynamic batcher as a plain state machine over one model's queue, its payloads
and its instances, with time passed in as integer nanoseconds.

``BatcherCore`` makes every batch decision by calling the simulator's own
``get_dynamic_batch`` (the same compiled function ``triton_engine`` uses), and follows
the same loop: instances finishing, arrivals, instances taking waiting payloads, the
batcher thread, timeouts. Two drivers: a test drives it with a discrete-event clock and
checks it against the engine request by request (tests/unit/test_gateway_batcher.py);
the gateway's ``AsyncBatcher`` (gateway/batcher.py) drives it with the real clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from servelab.batching.triton_engine import (
    IDLE_WAIT_NS,
    get_dynamic_batch,
    get_dynamic_batch_rows,
    preference_tables,
)
from servelab.scenario import BatchingPolicy

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class Payload(Generic[T]):
    """A batch being formed, waiting for an instance, or running."""

    items: list[T] = field(default_factory=list)
    arrivals_ns: list[int] = field(default_factory=list)
    started: bool = False
    rows: int = 0  # the batch's size as Triton counts it: its requests' rows


class BatcherCore(Generic[T]):
    """One model's batcher: queue, current payload, waiting payloads, idle instances.

    ``on_start(payload)`` is called when an instance takes a payload; the caller runs
    it and calls ``complete(now)`` when it is done. ``arrive`` returns False when the
    queue is full (``max_queue_size``); ``step`` returns the requests that timed out.

    Batches are counted in rows, as Triton counts them: a request of several rows fills
    that much of max_batch_size and of a preferred size. While every queued request
    holds one row (the simulator's workloads, most gateway traffic) the decision is the
    compiled `get_dynamic_batch`; with a larger one queued, `get_dynamic_batch_rows`,
    which decides the same on one-row requests. With ``dynamic`` False (a Triton model
    without ``dynamic_batching``) each request runs alone, as Triton's default
    scheduler runs it.
    """

    def __init__(self, policy: BatchingPolicy, num_instances: int,
                 on_start: Callable[[Payload[T]], None], dynamic: bool = True) -> None:
        mbs = policy.max_batch_size
        self.dynamic = dynamic
        self.mbs = mbs
        self.delay_ns = policy.max_queue_delay_microseconds * 1000
        self.timeout_ns = policy.default_timeout_microseconds * 1000
        self.max_queue_size = policy.max_queue_size
        prefs = frozenset(policy.effective_preferred)
        self.prefs = prefs
        self.is_pref = np.zeros(mbs + 1, np.bool_)
        self.is_pref[list(prefs)] = True
        self.pref_floor, self.pref_above = preference_tables(self.is_pref, mbs)
        self.max_pref = int(self.pref_floor[mbs])
        self.slots = 2 * num_instances
        # Triton 2.51 prefetches payloads only without a queue policy (triton_engine,
        # rule 1): with one, a payload forms only while an instance waits for work.
        self.prefetch = not (policy.max_queue_size or policy.default_timeout_microseconds)
        self.idle = num_instances
        self.on_start = on_start
        self.queue: deque[tuple[T, int, int]] = deque()  # (item, arrival ns, rows) queued
        self.queued_rows = 0
        self.multi_row = 0  # queued requests of more than one row
        self.waiting: deque[Payload[T]] = deque()  # payloads handed over, not started
        self.current: Payload[T] | None = None  # the payload the thread is filling
        self.saturated = False
        self.next_pref = 0
        self.timer_ns = 0  # the thread starts asleep on an empty queue
        self.timer_idle = True
        self.blocked = False
        self.wake = False
        # Compile (or load from Numba's cache) the decision for these argument types now,
        # not on the first request.
        get_dynamic_batch(1, 0, 0, self.is_pref, self.pref_floor, self.pref_above,
                          self.max_pref, self.mbs, self.delay_ns, False)

    # -- events -------------------------------------------------------------------------
    def arrive(self, item: T, now: int, rows: int = 1) -> bool:
        """Queue a request of `rows` rows (1 to max_batch_size: the caller refuses
        larger); False if the queue is full (Triton answers 503)."""
        if self.max_queue_size and len(self.queue) >= self.max_queue_size:
            return False
        self.queue.append((item, now, rows))
        self.queued_rows += rows
        if rows > 1:
            self.multi_row += 1
        stale = self.current is not None and self.current.started
        if self._slot_free() and (
                self.saturated or stale or self.queued_rows >= self.next_pref):
            self.wake = True
        return True

    def complete(self, now: int) -> None:
        """An instance finished its payload: it is idle, and the callback wakes the thread."""
        self.idle += 1
        self.wake = True

    def step(self, now: int) -> list[T]:
        """Everything that happens at `now` after the events: instances take waiting
        payloads, the thread runs if woken, queued requests past their timeout leave."""
        if self.timer_idle and not self.blocked and self.queue and self.timer_ns < now:
            self.timer_ns += -(-(now - self.timer_ns) // IDLE_WAIT_NS) * IDLE_WAIT_NS
        if not self.blocked and self.timer_ns <= now and (self.queue or not self.timer_idle):
            self.wake = True
        self._dispatch(now)
        if self.wake and not (self.blocked and not self._slot_free()):
            self._run_thread(now)
        self.wake = False
        expired: list[T] = []
        while self.timeout_ns and self.queue and self.queue[0][1] + self.timeout_ns <= now:
            expired.append(self._pop()[0])
        return expired

    def _pop(self) -> tuple[T, int, int]:
        item = self.queue.popleft()
        self.queued_rows -= item[2]
        if item[2] > 1:
            self.multi_row -= 1
        return item

    def next_event_ns(self) -> int | None:
        """When `step` must run next with no other event (the thread's timer, a timeout)."""
        t: int | None = None
        if not self.blocked and (self.queue or not self.timer_idle):
            t = self.timer_ns
        if self.queue and self.timeout_ns:
            deadline = self.queue[0][1] + self.timeout_ns
            t = deadline if t is None else min(t, deadline)
        return t

    # -- the batcher thread --------------------------------------------------------------
    def _slot_free(self) -> bool:
        """May the thread hand over a payload? With prefetching while fewer than `slots`
        wait; without, while an idle instance has none waiting for it."""
        if self.prefetch:
            return len(self.waiting) < self.slots
        return self.idle > len(self.waiting)

    def _dispatch(self, now: int) -> None:
        while self.idle > 0 and self.waiting:
            p = self.waiting.popleft()
            p.started = True
            # InstanceQueue::Dequeue (triton_engine, rule 7): the payloads behind it whose
            # oldest request waited past the delay are marked executing (a current one
            # grows no more) and merged while they fit
            while self.waiting and self.delay_ns > 0 and self.mbs > 1:
                front = self.waiting[0]
                if now - front.arrivals_ns[0] <= self.delay_ns:
                    break
                front.started = True
                if p.rows + front.rows > self.mbs:
                    break
                self.waiting.popleft()
                p.items += front.items
                p.arrivals_ns += front.arrivals_ns
                p.rows += front.rows
            self.idle -= 1
            self.on_start(p)

    def _run_thread(self, now: int) -> None:
        while True:
            self._dispatch(now)
            cur = self.current
            if self.saturated or (cur is not None and cur.started):  # NewPayload()
                self.current = cur = None
                self.saturated = False
                self.next_pref = 0
            if not self.queue:
                self.timer_ns, self.timer_idle, self.blocked = now + IDLE_WAIT_NS, True, False
                return
            if not self._slot_free():
                self.blocked = True
                return
            self.blocked = False
            k = cur.rows if cur is not None else 0
            take, wait_us, saturated, nxt = self._decide(k, now)
            self.saturated = bool(saturated)
            if nxt >= 0:
                self.next_pref = int(nxt)
            if take > 0:
                if cur is None:
                    cur = self.current = Payload()
                    self.waiting.append(cur)
                for _ in range(take):
                    item, at, rows = self._pop()
                    cur.items.append(item)
                    cur.arrivals_ns.append(at)
                    cur.rows += rows
                continue
            if wait_us > 0:
                self.timer_ns, self.timer_idle = now + int(wait_us) * 1000, False
                return
            if not self.saturated:
                self.timer_ns, self.timer_idle = now + IDLE_WAIT_NS, True
                return

    def _decide(self, k: int, now: int) -> tuple[int, int, bool, int]:
        """Triton's GetDynamicBatch on the queue and a payload of k rows."""
        age = now - self.queue[0][1]
        if not self.dynamic:  # no dynamic_batching: one request a batch, now
            return (0, 0, True, -1) if k else (1, 0, True, -1)
        if self.multi_row:
            return get_dynamic_batch_rows((r for _, _, r in self.queue), k, age, self.prefs,
                                          self.max_pref, self.mbs, self.delay_ns,
                                          self.saturated)
        take, wait_us, saturated, nxt = get_dynamic_batch(
            len(self.queue), k, age, self.is_pref, self.pref_floor, self.pref_above,
            self.max_pref, self.mbs, self.delay_ns, self.saturated)
        return int(take), int(wait_us), bool(saturated), int(nxt)
