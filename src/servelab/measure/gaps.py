"""Idle gaps of about the batcher's default wait (500 ms) while requests waited: the
mark of Triton 2.51's lost wake-up with a queue policy (triton_engine, rule 6), which
`validate` and `replay-trace` look for in what they measured."""

from __future__ import annotations

import numpy as np

BATCHER_WAIT_NS = 500_000_000  # Triton's default_wait_microseconds
GAP_TOLERANCE = 0.1  # a gap within 10% of the wait counts


def wait_gaps(free_ns: np.ndarray, next_ns: np.ndarray, waiting_since_ns: np.ndarray
              ) -> tuple[int, float]:
    """(count, total seconds) of the gaps from free_ns[i] to next_ns[i] lasting about
    BATCHER_WAIT_NS although a request was waiting (waiting_since_ns[i] < free_ns[i])."""
    gap = next_ns - free_ns
    hit = ((np.abs(gap - BATCHER_WAIT_NS) <= GAP_TOLERANCE * BATCHER_WAIT_NS)
           & (waiting_since_ns < free_ns))
    return int(hit.sum()), float(gap[hit].sum() / 1e9)


def answer_gaps(sent_ns: np.ndarray, done_ns: np.ndarray) -> tuple[int, float]:
    """From a client's view: gaps between consecutive answers while a request sent
    before the first of them was still unanswered."""
    if done_ns.size < 2:
        return 0, 0.0
    order = np.argsort(done_ns, kind="stable")
    d, s = done_ns[order], sent_ns[order]
    earliest_later = np.minimum.accumulate(s[::-1])[::-1]  # of requests answered from i on
    return wait_gaps(d[:-1], d[1:], earliest_later[1:])


def batch_gaps(queue_ns: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray
               ) -> tuple[int, float]:
    """From a server trace: gaps with every instance idle (after the latest end so far,
    before the next start) while a request had entered the queue."""
    if start_ns.size < 2:
        return 0, 0.0
    order = np.argsort(start_ns, kind="stable")
    q, s, e = queue_ns[order], start_ns[order], end_ns[order]
    free = np.maximum.accumulate(e)[:-1]
    earliest_later = np.minimum.accumulate(q[::-1])[::-1]
    return wait_gaps(free, s[1:], earliest_later[1:])


def gap_note(count: int, seconds: float, where: str) -> list[str]:
    if not count:
        return []
    return [f"{where}: {count} gap(s) of about 500 ms ({seconds:.1f} s in all) in which "
            "requests waited and nothing ran: the batcher's default wait. Triton 2.51 with "
            "a queue policy misses wake-ups; set [batching] lost_wakeup (0.06 was measured "
            "on the test's tritonserver) to simulate it (docs/simulator.md)"]


def full_queue_stalls(sent_ns: np.ndarray, done_ns: np.ndarray, queue_limit: int
                      ) -> tuple[int, int]:
    """From a client's view of a server with `max_queue_size` = queue_limit: (stalls,
    chances). A chance is an answer while queue_limit or more requests (sent before it,
    answered after it) waited: a full queue, where a missed wake-up cannot be ended by an
    arrival (those are rejected), so it lasts the batcher's whole wait. A stall is such
    an answer followed by a gap of about BATCHER_WAIT_NS. stalls / chances estimates the
    run's `[batching] lost_wakeup` (triton_engine, rule 6)."""
    if done_ns.size < 2 or queue_limit < 1:
        return 0, 0
    order = np.argsort(done_ns, kind="stable")
    d, s = done_ns[order], sent_ns[order]
    # requests sent by each answer's time, less those answered by then (itself included)
    sent_by = np.searchsorted(np.sort(s), d, side="right")
    waiting = sent_by - (np.arange(d.size) + 1)
    full = waiting[:-1] >= queue_limit
    gap = np.diff(d)
    stall = full & (np.abs(gap - BATCHER_WAIT_NS) <= GAP_TOLERANCE * BATCHER_WAIT_NS)
    return int(stall.sum()), int(full.sum())


STALL_MIN_NS = 2_000_000  # an arrival this long after an answer tells a stall from jitter


def timeout_stalls(sent_ns: np.ndarray, done_ns: np.ndarray, served: np.ndarray,
                   exec_ns: float, timeout_ns: int) -> tuple[int, int]:
    """From a client's view of one instance running one request at a time with a default
    timeout and no queue limit: (stalls, chances), whose ratio estimates the run's
    `[batching] lost_wakeup` (triton_engine, rule 6).

    A chance is a served answer at d while a request sent before it, still within its
    timeout, was unanswered, and the next send came at least STALL_MIN_NS after d (so
    the two outcomes below are told apart; whether a wake-up is lost does not depend on
    when the next request comes, so these chances are a fair sample). The next served
    answer then comes about `exec_ns` after d if the batcher woke, or about `exec_ns`
    after that next send if it missed the wake-up and slept until the arrival woke it.
    A stall is a chance whose next answer is nearer the second."""
    ok = np.asarray(served, dtype=bool)
    if ok.sum() < 2:
        return 0, 0
    d = np.sort(done_ns[ok])
    s_sorted = np.sort(sent_ns)
    nxt = np.searchsorted(s_sorted, d[:-1], side="right")
    has_next = nxt < s_sorted.size
    a = np.where(has_next, s_sorted[np.minimum(nxt, s_sorted.size - 1)], 0)
    # requests sent before d and answered after it, their deadline not yet passed
    order = np.argsort(sent_ns, kind="stable")
    s_o, e_o = sent_ns[order], done_ns[order]
    waiting = np.zeros(d.size - 1, dtype=bool)
    lo = np.searchsorted(s_o, d[:-1] - timeout_ns, side="right")
    for i in range(d.size - 1):  # the window holds a handful of requests at most
        w = slice(lo[i], nxt[i])
        waiting[i] = bool(np.any(e_o[w] > d[i]))
    chance = waiting & has_next & (a - d[:-1] >= STALL_MIN_NS)
    woke = d[:-1] + exec_ns
    slept = a + exec_ns
    stall = chance & (np.abs(d[1:] - slept) < np.abs(d[1:] - woke))
    return int(stall.sum()), int(chance.sum())
