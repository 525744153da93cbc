"""The parts the batching engine (``triton_engine``) and its callers share: request and
batch records, a run's state between calls, the instance heaps, and the start of a
batch, compiled with Numba where the engine calls them.

Time is integer nanoseconds, so ties are exact. A request's status is SERVED,
REJECTED (``max_queue_size``, at enqueue) or TIMED_OUT (``default_timeout_microseconds``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

SERVED, REJECTED, TIMED_OUT = 0, 1, 2
_NEVER = np.int64(1) << np.int64(62)


@njit(cache=True, nogil=True)
def _sift_up(key: np.ndarray, val: np.ndarray, i: int) -> None:
    """Restore a binary min-heap on (key, val) after a push at position i."""
    while i > 0:
        parent = (i - 1) >> 1
        if key[parent] < key[i] or (key[parent] == key[i] and val[parent] <= val[i]):
            break
        key[parent], key[i] = key[i], key[parent]
        val[parent], val[i] = val[i], val[parent]
        i = parent


@njit(cache=True, nogil=True)
def _sift_down(key: np.ndarray, val: np.ndarray, size: int) -> None:
    """Restore a binary min-heap on (key, val) after the root was replaced."""
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        small = left
        right = left + 1
        if right < size and (key[right] < key[left] or (
                key[right] == key[left] and val[right] < val[left])):
            small = right
        if key[i] < key[small] or (key[i] == key[small] and val[i] <= val[small]):
            break
        key[small], key[i] = key[i], key[small]
        val[small], val[i] = val[i], val[small]
        i = small


@njit(cache=True, nogil=True)
def heap_push(key: np.ndarray, val: np.ndarray, size: int, k: int, v: int) -> None:
    """Add (k, v) to the binary min-heap of `size` entries (the caller counts it)."""
    key[size] = k
    val[size] = v
    _sift_up(key, val, size)


@njit(cache=True, nogil=True)
def heap_pop(key: np.ndarray, val: np.ndarray, size: int) -> int:
    """Remove the smallest (key, val) of a heap of `size` entries; returns its val."""
    v: int = val[0]
    key[0] = key[size - 1]
    val[0] = val[size - 1]
    _sift_down(key, val, size - 1)
    return v


@njit(cache=True, nogil=True)
def start_batch(t: int | np.int64, ids: np.ndarray, lo: int, size: int, nb: int, inst: int,
                exec_ns: np.ndarray, multiplier: np.ndarray, status: np.ndarray,
                batch_of: np.ndarray, b_size: np.ndarray, b_start: np.ndarray,
                b_end: np.ndarray, b_inst: np.ndarray) -> int:
    """Record batch `nb` of ids[lo:lo + size] starting at t on `inst`; returns its end.
    A request keeps only its status and batch number: its start and end are its batch's."""
    # one multiplier per batch, or a single one for all (deterministic service)
    m = multiplier[nb] if multiplier.size > 1 else multiplier[0]
    dur = max(np.int64(1), np.int64(np.rint(exec_ns[size] * m)))
    done = t + dur
    for j in range(lo, lo + size):
        r = ids[j]
        status[r] = SERVED
        batch_of[r] = nb
    b_size[nb] = size
    b_start[nb] = t
    b_end[nb] = done
    b_inst[nb] = inst
    return int(done)


def check_multipliers(multiplier: np.ndarray, n: int) -> None:
    """A run of n requests takes one service multiplier per possible batch, or one."""
    if multiplier.size != 1 and multiplier.size < n:
        raise ValueError("need one service multiplier per possible batch (one per request), "
                         "or one for all")


_HUGE_PAGE = 1 << 21  # NumPy advises huge pages for arrays of twice this or more


def huge_block(nbytes: int) -> np.ndarray:
    """`nbytes` of uninitialised uint8 that, from 512 KiB, start on a 2 MiB boundary of an
    allocation of at least 4 MiB: NumPy advises huge pages for such allocations, but only
    from the first boundary inside them, so a block that starts there is huge pages
    throughout. The spare room is never touched, so it costs address space; a block under
    2 MiB still takes a whole huge page of memory (at most 1.5 MiB more than it needs),
    which a run of a few hundred thousand requests repays in fewer page faults."""
    if nbytes < _HUGE_PAGE // 4:
        return np.empty(nbytes, np.uint8)
    raw = np.empty(max(nbytes, _HUGE_PAGE) + _HUGE_PAGE, np.uint8)  # 4 MiB+: NumPy advises
    skip = -raw.ctypes.data % _HUGE_PAGE
    return raw[skip:skip + nbytes]


def _carve(arena: np.ndarray, offset: int, count: int, dtype: type) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    return arena[offset:offset + count * size].view(dtype)


def new_records(n: int, batch_cap: int) -> tuple[np.ndarray, ...]:
    """The engines' outputs and their queue, 9 bytes a request and 24 a batch: per
    request its status and batch number (-1 unless served); per batch its size, start,
    end and instance; the queue of request ids. Not initialised: a run writes each
    request's two once, when it is decided (every request is, by the run's end), and a
    batch's four when it starts; nothing is read before it is written.

    Allocated here by NumPy, not inside the compiled engine, as a few large blocks: NumPy
    asks the kernel for huge pages (2 MiB) for arrays of 4 MiB or more, and a
    million-request run then takes about 10 page faults where 4 KiB pages took some
    3,400. The per-request records share one block, the per-batch ones another; the
    queue, needed only during the run, gets its own."""
    at = (n + 63) // 64 * 64  # the batch numbers start 64-byte aligned
    per_request = huge_block(at + 4 * n)
    status = _carve(per_request, 0, n, np.int8)
    batch_of = _carve(per_request, at, n, np.int32)
    per_batch = huge_block(24 * batch_cap)
    b_start = _carve(per_batch, 0, batch_cap, np.int64)
    b_end = _carve(per_batch, 8 * batch_cap, batch_cap, np.int64)
    b_size = _carve(per_batch, 16 * batch_cap, batch_cap, np.int32)
    b_inst = _carve(per_batch, 20 * batch_cap, batch_cap, np.int32)
    queue = huge_block(4 * n).view(np.int32)
    return status, batch_of, b_size, b_start, b_end, b_inst, queue


def more_room(records: tuple[np.ndarray, ...], nb: int) -> tuple[np.ndarray, ...]:
    """The same records with room for twice as many batches, the first nb copied."""
    status, batch_of, b_size, b_start, b_end, b_inst, queue = records
    _, _, size, start, end, inst, _ = new_records(0, 2 * b_size.size)
    for new, old in ((size, b_size), (start, b_start), (end, b_end), (inst, b_inst)):
        new[:nb] = old[:nb]
    return status, batch_of, size, start, end, inst, queue


# What an engine keeps between calls, so a run can go a part of the arrivals at a time:
# its scalars in one int64 array (these indices), then its instance heaps and payload ring.
(S_NXT, S_NB, S_HEAD, S_TAIL, S_N_BUSY, S_N_IDLE, S_M_TAIL, S_RQ_HEAD, S_RQ_COUNT,
 S_CP_OPEN, S_CP_STALE, S_SATURATED, S_NEXT_PREF, S_TIMER, S_TIMER_IDLE, S_BLOCKED,
 S_SEEDED, S_BLOCK_T, S_LOST) = range(19)
# What a call returns: the run is over; it stopped before the first instant it may not
# know every arrival of; it stopped for room for more batches (see `more_room`).
DONE, MORE_ARRIVALS, MORE_ROOM = 0, 1, 2


def new_state(num_instances: int) -> tuple[np.ndarray, ...]:
    """A run's state before its first call: every instance idle, nothing queued, the
    batcher thread asleep on the empty queue. Scalars, then the heap of busy instances
    (free time, index), the heap of idle ones (index, index), and the rate limiter's ring
    of payloads (start, length) with room for 2 per instance (the Triton engine's)."""
    scalars = np.zeros(19, np.int64)
    scalars[S_N_IDLE] = num_instances
    scalars[S_TIMER_IDLE] = 1
    scalars[S_LOST] = _NEVER  # no missed wake-up pending
    idle = np.arange(num_instances, dtype=np.int64)  # sorted: a heap already
    ring = 2 * num_instances + 1
    return (scalars, np.zeros(num_instances, np.int64), np.zeros(num_instances, np.int64),
            idle, idle.copy(), np.zeros(ring, np.int64), np.zeros(ring, np.int64))
