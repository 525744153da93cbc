"""A front end whose one event loop also writes the answers, run with the batcher as one.

servelab's gateway (any asyncio server) parses each new request and writes each answer
on the same event loop. A loop busy writing a batch's answers takes no new requests
meanwhile, so its next turn hands the batcher more of them at once: under load the
batches grow, and answers wait behind new requests and each other. A pass of the front
end before the batcher (``simulate.frontend_pass``) cannot show this, since when a batch
ends depends on when the loop handed its requests on, and when the loop can take a new
request depends on which batches ended before. So the loop and the Triton engine run
here in time order, turn by turn:

- The loop's next turn starts at the first item waiting (a request's arrival at the
  server, or the end of a batch whose answers are not written) or at its last turn's
  end, whichever is later. It takes every item waiting by then: first the ended
  batches' answers in the order the batches ended (a request's answer takes
  ``answer_ns``), then the new requests (each ``cost_ns``), which it hands to the batcher
  together at the turn's end. A turn costs ``turn_ns`` besides.
- Before a turn is decided, the engine runs up to the instant the turn could start
  (the next request's arrival, or the loop's last turn end if later): the batcher sees
  no request before then, since the next one it sees leaves a turn that starts no
  earlier. The engine's own stopping rule does this: given `limit` arrivals it stops
  before the first instant at or after arrival ``limit - 1``, so that arrival is set to
  the turn's earliest start (a lower bound of its real hand-over, written over when the
  turn is decided). Every batch that ends before the turn starts began before that
  instant, so it is known.

The batcher's arrivals array has one entry more than the requests: the last is never
(``_NEVER``) and stands for "no more arrivals", so the real last request can be a lower
bound too.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from servelab.batching.engine import (
    _NEVER,
    DONE,
    S_NB,
    check_multipliers,
    heap_pop,
    heap_push,
    new_records,
    new_state,
)
from servelab.batching.triton_engine import run_batcher_triton
from servelab.scenario import BatchingPolicy

__all__ = ["answering_run"]


@njit(cache=True, nogil=True)
def _answering(sent_ns: np.ndarray, at_ns: np.ndarray, cost_ns: int, turn_ns: int,
               answer_ns: int, exec_ns: np.ndarray, multiplier: np.ndarray,
               preferred: np.ndarray, mbs: int, delay_ns: int, num_instances: int,
               max_queue_size: int, timeout_ns: int, records: tuple[np.ndarray, ...],
               state: tuple[np.ndarray, ...], batcher_first: float, seed: int,
               lost_wakeup: float, answers_from_ns: np.ndarray) -> None:
    """The loop and the engine turn by turn (see the module's doc). `at_ns` (n + 1, the
    last _NEVER) gets each request's hand-over to the batcher; `answers_from_ns[b]` the
    instant the loop starts on batch b's answers."""
    n = sent_ns.size
    b_size, b_end = records[2], records[4]
    ends = np.empty(n + num_instances + 1, np.int64)  # batches ended, answers not written
    ids = np.empty(n + num_instances + 1, np.int64)
    pending = 0
    seen = 0  # batches the engine has started and the loop has heard of
    i = 0  # the next request not yet through the loop
    free = np.int64(0)  # the last turn's end
    done = False
    while True:
        if not done:
            if i < n:
                at_ns[i] = max(sent_ns[i], free)  # the next turn's earliest start
            # every request through the loop: the engine runs to the end (_NEVER last)
            code = run_batcher_triton(at_ns, exec_ns, multiplier, preferred, mbs, delay_ns,
                                      num_instances, max_queue_size, timeout_ns, records,
                                      state, min(i, n) + 1, batcher_first, seed,
                                      lost_wakeup)
            done = i >= n and code == DONE
            nb = state[0][S_NB]
            for b in range(seen, nb):
                heap_push(ends, ids, pending, b_end[b], b)
                pending += 1
            seen = nb
        if i >= n and pending == 0 and done:
            break
        first = sent_ns[i] if i < n else _NEVER
        if pending > 0 and ends[0] < first:
            first = ends[0]
        if first == _NEVER:  # nothing waits, and the engine has more to run
            continue
        start = max(first, free)
        t = start + turn_ns
        while pending > 0 and ends[0] <= start:
            b = heap_pop(ends, ids, pending)
            pending -= 1
            answers_from_ns[b] = t
            t += b_size[b] * answer_ns
        j = i
        while j < n and sent_ns[j] <= start:
            j += 1
        free = t + (j - i) * cost_ns
        for k in range(i, j):
            at_ns[k] = free
        i = j


def answering_run(sent_ns: np.ndarray, cost_ns: int, turn_ns: int, answer_ns: int,
                  exec_ns: np.ndarray, multiplier: np.ndarray, policy: BatchingPolicy,
                  num_instances: int, seed: int = 0
                  ) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray]:
    """The batcher behind an event loop that parses and answers: (the engine's records
    (status, batch, and per batch its size, start, end and instance), each request's
    hand-over to the batcher (ns), and each request's answer written (ns; -1 unless
    served)). Its answer is written after every answer of an earlier request of its
    batch. `seed` as for `simulate.simulate_policy`."""
    n = sent_ns.size
    check_multipliers(multiplier, n)
    preferred = np.zeros(policy.max_batch_size + 1, dtype=np.bool_)
    preferred[list(policy.effective_preferred)] = True
    at_ns = np.empty(n + 1, np.int64)
    at_ns[n] = _NEVER
    # one batch a request at most: the engine never runs out of room for batches
    records = new_records(n + 1, n + num_instances + 1)
    state = new_state(num_instances)
    answers_from = np.full(n + num_instances + 1, -1, np.int64)
    _answering(np.ascontiguousarray(sent_ns, dtype=np.int64), at_ns, cost_ns, turn_ns,
               answer_ns, np.ascontiguousarray(exec_ns, dtype=np.float64),
               np.ascontiguousarray(multiplier, dtype=np.float64), preferred,
               policy.max_batch_size, policy.max_queue_delay_microseconds * 1000,
               num_instances, policy.max_queue_size,
               policy.default_timeout_microseconds * 1000, records, state,
               float(policy.batcher_first), seed % 2**32, float(policy.lost_wakeup),
               answers_from)
    nb = int(state[0][S_NB])
    status, batch_of, b_size, b_start, b_end, b_inst, _ = records
    kept = (status[:n], batch_of[:n], b_size[:nb], b_start[:nb], b_end[:nb], b_inst[:nb])
    batch = batch_of[:n].astype(np.int64)
    served = np.flatnonzero(batch >= 0)
    in_batch = served[np.argsort(batch[served], kind="stable")]  # by batch, then request
    firsts = np.cumsum(b_size[:nb], dtype=np.int64) - b_size[:nb]
    rank = np.arange(in_batch.size, dtype=np.int64) - firsts[batch[in_batch]]
    answered = np.full(n, -1, np.int64)
    answered[in_batch] = answers_from[batch[in_batch]] + (rank + 1) * answer_ns
    return kept, at_ns[:n], answered
