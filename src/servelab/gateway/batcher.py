"""The gateway's dynamic batcher: ``AsyncBatcher`` drives the simulator's own batcher
state machine (``batching.state.BatcherCore``, the rule's decisions by the engine's
``get_dynamic_batch``) with the real clock, from a timer thread and one thread per
instance, as Triton does.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servelab.batching.state import BatcherCore, Payload
from servelab.scenario import BatchingPolicy

MAX_LEAD_NS = 2_000_000  # the timer never aims more than 2 ms early
NEVER = 1 << 62  # ns: a wait without a timeout


@dataclass(slots=True, eq=False)
class Pending:
    """One request in the gateway: its inputs and the future its answer goes to."""

    inputs: Any
    future: asyncio.Future[Any]
    arrived_ns: int
    started_ns: int = 0


class AsyncBatcher:
    """Drives a BatcherCore with the real clock, in threads as Triton does: a timer
    thread sleeps until the core's next event (the batcher thread's wait, a timeout),
    one thread per instance runs payloads and, the moment one finishes, takes the next
    waiting payload itself; arrivals come from request handlers on the event loop. All
    of them hold one lock around the core, so no decision waits for the event loop,
    whose timers round up to whole milliseconds and which is busy parsing requests under
    load. Answers go back to the loop in one call per batch."""

    def __init__(self, policy: BatchingPolicy, num_instances: int,
                 execute: Callable[[list[Any]], list[Any]],
                 on_batch: Callable[[int, int, int], None] | None = None,
                 on_request: Callable[[int, int, int], None] | None = None,
                 dynamic: bool = True) -> None:
        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)
        self.core: BatcherCore[Pending] = BatcherCore(policy, num_instances, self._start,
                                                      dynamic)
        self.execute = execute
        self.on_batch = on_batch  # (batch size, queue ns summed, compute ns) per batch
        self.on_request = on_request  # (queued, started, done ns) per answered request
        self.loop: asyncio.AbstractEventLoop | None = None
        self.work: queue.SimpleQueue[Payload[Pending] | None] = queue.SimpleQueue()
        self.num_instances = num_instances
        self.in_flight = 0  # accepted and not yet answered (event loop thread only)
        self.closed = False
        self.lead_ns = 0  # how early the timer thread aims (its recent lateness)
        self.clock_ns = 0  # the latest time given to the core: it never goes back
        # When the timer thread's wait ends (ns; NEVER: no timeout; 0: it is not waiting
        # and reads the core before it waits again). Waking it costs a thread switch and
        # the GIL, so an arrival or a completion wakes it only when its event comes
        # before that.
        self.timer_wakes_ns = 0

    @staticmethod
    def now() -> int:
        return time.monotonic_ns()

    def _begin(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        for i in range(self.num_instances):
            threading.Thread(target=self._instance, name=f"servelab-instance-{i}",
                             daemon=True).start()
        threading.Thread(target=self._timer, name="servelab-batcher", daemon=True).start()

    def submit(self, inputs: Any, rows: int = 1) -> asyncio.Future[Any] | None:
        """Queue one request of `rows` rows (at most max_batch_size: the protocol refuses
        larger); None if the queue is full."""
        if self.loop is None:
            self._begin(asyncio.get_running_loop())
        assert self.loop is not None
        fut: asyncio.Future[Any] = self.loop.create_future()
        with self.lock:
            expired = self._catch_up(self.now())
            now = self.clock_ns
            if not self.core.arrive(Pending(inputs, fut, now), now, rows):
                self._expire(expired)
                return None
            expired += self.core.step(now)
            self._wake_timer_if_due_sooner()
        self._expire(expired)
        self.in_flight += 1
        fut.add_done_callback(self._answered)
        return fut

    def close(self) -> None:
        """Stop the threads (they are daemons: a process that exits needs not call it)."""
        with self.lock:
            self.closed = True
            self.wakeup.notify_all()
        for _ in range(self.num_instances):
            self.work.put(None)

    def _catch_up(self, now: int) -> list[Pending]:
        """Run the core's timed events that fell due before `now` at their own times, then
        move the clock to `now` (the caller holds the lock).

        The timer thread's wait can end late (the interpreter lock, a busy machine). An
        arrival or a completion that comes in the meantime must not be taken as earlier
        than the deadline: in the rule a batch whose delay expired at t closes with what
        was queued at t, so the deadline's step runs first, at t."""
        expired: list[Pending] = []
        for _ in range(64):  # each round retires one due event; more is a core bug
            at = self.core.next_event_ns()
            if at is None or max(at, self.clock_ns) >= now:
                break
            self.clock_ns = t = max(at, self.clock_ns)
            expired += self.core.step(t)
            if self.core.next_event_ns() == at:  # no progress at t (a blocked thread)
                break
        self.clock_ns = max(now, self.clock_ns)
        return expired

    def _wake_timer_if_due_sooner(self) -> None:
        """Wake the timer thread if the core's next event comes before the end of its
        wait (the caller holds the lock)."""
        at = self.core.next_event_ns()
        if at is not None and at - self.lead_ns < self.timer_wakes_ns:
            self.wakeup.notify()

    def _answered(self, _f: asyncio.Future[Any]) -> None:
        self.in_flight -= 1

    @staticmethod
    def _expire(expired: list[Pending]) -> None:
        for p in expired:
            if not p.future.done():
                p.future.set_exception(TimeoutError("Request timeout expired"))

    def _timer(self) -> None:
        """The batcher thread's clock: run the core at its next event.

        A thread's timed wait ends late, and later still while the event loop holds the
        GIL (0.1 ms idle, 0.3-0.8 ms busy on a 2-core machine). Left alone that lateness
        stretches every max_queue_delay, so the thread aims early by the lateness it has
        been seeing (an exponential average) and runs the event as due: on average the
        delay ends on time, as Triton's does.
        """
        assert self.loop is not None
        with self.lock:
            while not self.closed:
                at = self.core.next_event_ns()
                now = self.now()
                if at is None:
                    self._wait(NEVER, None)
                    continue
                if at > now + self.lead_ns:
                    aim = at - self.lead_ns
                    self._wait(aim, (aim - now) / 1e9)
                    woke = self.now()
                    if woke >= aim and self.core.next_event_ns() == at:  # a timed-out wait
                        late = min(woke - aim, MAX_LEAD_NS)
                        self.lead_ns += (late - self.lead_ns) // 8
                    continue
                # Due (or within the lead, or late): the core runs the event at its own
                # time, never before the latest time it was given.
                t = max(at, self.clock_ns)
                self.clock_ns = t
                expired = self.core.step(t)
                if expired:
                    self.loop.call_soon_threadsafe(self._expire, expired)
                if (self.core.next_event_ns() or at + 1) <= at:  # no progress: yield
                    self._wait(now + 50_000, 50e-6)

    def _wait(self, until_ns: int, timeout_s: float | None) -> None:
        """The timer thread's wait (lock held), with its end where arrivals read it."""
        self.timer_wakes_ns = until_ns
        try:
            self.wakeup.wait(timeout_s)
        finally:
            self.timer_wakes_ns = 0

    def _start(self, payload: Payload[Pending]) -> None:
        """Called by the core, under the lock, when an instance takes a payload."""
        started = self.now()
        for p in payload.items:
            p.started_ns = started
        self.work.put(payload)

    def _instance(self) -> None:
        assert self.loop is not None
        while True:
            payload = self.work.get()
            if payload is None:
                return
            started = payload.items[0].started_ns
            result: list[Any] | None = None
            error: BaseException | None = None
            try:
                result = self.execute([p.inputs for p in payload.items])
            except Exception as exc:  # the model failed on this batch: each request hears
                error = exc
            with self.lock:
                expired = self._catch_up(self.now())
                now = self.clock_ns
                self.core.complete(now)
                expired += self.core.step(now)  # this instance's next payload, if waiting
                self._wake_timer_if_due_sooner()
            self.loop.call_soon_threadsafe(self._deliver, payload, result, error, started,
                                           now, expired)

    def _deliver(self, payload: Payload[Pending], result: list[Any] | None,
                 error: BaseException | None, started: int, done: int,
                 expired: list[Pending]) -> None:
        self._expire(expired)
        for i, p in enumerate(payload.items):
            if p.future.done():
                continue
            out = error if result is None else result[i]
            if isinstance(out, BaseException):  # the batch, or this request, failed
                p.future.set_exception(out)
            else:
                p.future.set_result((out, p.started_ns - p.arrived_ns))
                if self.on_request is not None:
                    self.on_request(p.arrived_ns, started, done)
        if self.on_batch is not None:
            self.on_batch(len(payload.items), sum(started - p.arrived_ns for p in payload.items),
                          done - started)
