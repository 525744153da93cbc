"""Percentiles of int64 nanoseconds by radix selection, compiled with Numba.

A Report takes four percentiles and the mean of three arrays of up to millions
of latencies. ``np.percentile`` partitions each array (introselect, about 11 ms
a million values here); this finds the same order statistics in three linear
passes: the range and sum, then one histogram pass per 16 bits of the range
(a range under 2**32 ns, 4.3 s, takes two), every wanted rank narrowed in the
same pass. The input is not modified and nothing the size of the input is
allocated. Values may come with whole-number weights (each value counted that many
times): a batch's GPU time weighted by its size has the order statistics of the
per-request GPU times, from a fifth as many values. Or they may be read in place
from the batch records, a request's batch start or end less its arrival: its queue
time or its latency, without an array of them.

The percentile from the order statistics is NumPy's default ``linear`` method
(Hyndman and Fan's 7th), written as NumPy 2 computes it, so the two agree to
the bit (a hypothesis test holds them equal).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

_BITS = 16  # a histogram of 2**16 buckets per pass and per distinct interval

# Where the values come from: `x` as it is (w and batch None); `x` with a whole-number
# weight per value, each counted that many times (w given); or gathered from per-batch
# values, x[batch[i]] - arrival[i] for every request i with batch[i] >= 0 (batch and
# arrival given), computed as each pass reads it so no per-request array is built. A None
# argument is its own type to Numba, so each source compiles to its own loops with the
# other sources' branches pruned.


@njit(cache=True, nogil=True, inline="always")
def _tally(lo: Any, hi: Any, high: Any, low: Any, v: Any, c: Any) -> tuple[Any, Any, Any, Any]:
    mask = np.int64(0xFFFFFFFF)
    return min(lo, v), max(hi, v), high + (v >> 32) * c, low + (v & mask) * c


@njit(cache=True, nogil=True)
def _range_and_sum(x: np.ndarray, w: Any, batch: Any, arrival: Any
                   ) -> tuple[Any, Any, float]:
    """Minimum, maximum and the sum (exact, in two int64 halves: each value's high 32 bits
    and low 32 bits summed apart hold any int64 values for up to 2**31 of them, weights
    included; one rounding when the halves are joined)."""
    lo = np.int64(2**63 - 1)
    hi = np.int64(-(2**63))
    high = np.int64(0)
    low = np.int64(0)
    if batch is not None:
        for i in range(batch.size):
            b = batch[i]
            if b >= 0:
                lo, hi, high, low = _tally(lo, hi, high, low, x[b] - arrival[i], 1)
    elif w is not None:
        for i in range(x.size):
            if w[i] > 0:
                lo, hi, high, low = _tally(lo, hi, high, low, x[i], w[i])
    else:
        for v in x:
            lo, hi, high, low = _tally(lo, hi, high, low, v, 1)
    high += low >> 32
    return lo, hi, float(high) * 4294967296.0 + float(low & np.int64(0xFFFFFFFF))


@njit(cache=True, nogil=True)
def _bit_length(v: int) -> int:
    n = 0
    while v > 0:
        v >>= 1
        n += 1
    return n


_CHUNK = 4096  # values gathered from the batch records at a time


@njit(cache=True, nogil=True)
def _count(values: np.ndarray, w: Any, counts: np.ndarray, first: int, last: int, ng: int,
           g_lo: np.ndarray, g_hi: np.ndarray, g_shift: np.ndarray, size: Any) -> None:
    """Add each value (w[i] times, or once with w None) to the histogram of the interval it
    falls in, if any (the ng intervals are disjoint and ascending)."""
    shift = g_shift[0]
    for i in range(values.size):
        v = values[i]
        if v < first or v > last:
            continue
        c = 1 if w is None else w[i]
        if ng == 1:  # one interval (always so on the first pass): no search
            counts[(v - first) >> shift] += c
            continue
        for g in range(ng):
            if v <= g_hi[g]:
                if v >= g_lo[g]:
                    counts[g * size + ((v - g_lo[g]) >> g_shift[g])] += c
                break


@njit(cache=True, nogil=True)
def select_ranks(x: np.ndarray, w: Any, batch: Any, arrival: Any, ranks: np.ndarray,
                 lo: int, hi: int) -> np.ndarray:
    """The values at 0-based `ranks` (sorted ascending) of the sorted values (see above
    for w, batch and arrival), whose minimum and maximum are `lo` and `hi`, without
    sorting or modifying anything."""
    k = ranks.size
    ilo = np.full(k, lo, np.int64)  # each rank's interval [ilo, ihi] of values...
    ihi = np.full(k, hi, np.int64)
    res = ranks.copy()  # ...and its rank among the values inside it
    while True:
        # The distinct unresolved intervals (disjoint, in ascending order since the ranks
        # are: two ranks either share an interval or their intervals do not overlap).
        g_lo = np.empty(k, np.int64)
        g_hi = np.empty(k, np.int64)
        g_shift = np.empty(k, np.int64)
        g_of = np.full(k, -1, np.int64)
        ng = 0
        for j in range(k):
            if ilo[j] == ihi[j]:
                continue
            if ng > 0 and g_lo[ng - 1] == ilo[j] and g_hi[ng - 1] == ihi[j]:
                g_of[j] = ng - 1
                continue
            g_lo[ng] = ilo[j]
            g_hi[ng] = ihi[j]
            g_shift[ng] = max(0, _bit_length(ihi[j] - ilo[j]) - _BITS)
            g_of[j] = ng
            ng += 1
        if ng == 0:
            return ilo
        size = np.int64(1) << np.int64(_BITS)
        counts = np.zeros(ng * size, np.int64)
        first, last = g_lo[0], g_hi[ng - 1]
        if batch is None:
            _count(x, w, counts, first, last, ng, g_lo, g_hi, g_shift, size)
        else:  # gathered a chunk at a time into a buffer that stays in cache
            buf = np.empty(_CHUNK, np.int64)
            for lo_i in range(0, batch.size, _CHUNK):
                m = 0
                for i in range(lo_i, min(lo_i + _CHUNK, batch.size)):
                    b = batch[i]
                    if b >= 0:
                        buf[m] = x[b] - arrival[i]
                        m += 1
                _count(buf[:m], None, counts, first, last, ng, g_lo, g_hi, g_shift, size)
        for j in range(k):
            g = g_of[j]
            if g < 0:
                continue
            seen = 0
            b = 0
            while seen + counts[g * size + b] <= res[j]:
                seen += counts[g * size + b]
                b += 1
            res[j] -= seen
            ilo[j] = g_lo[g] + (np.int64(b) << g_shift[g])
            ihi[j] = min(g_hi[g], ilo[j] + (np.int64(1) << g_shift[g]) - 1)


def percentiles_ns(x: np.ndarray, percentiles: tuple[float, ...],
                   weights: np.ndarray | None = None) -> tuple[float, list[float]]:
    """The mean and the `percentiles` (0-100) of int64 values `x` (not empty), as
    ``x.mean()`` and ``np.percentile(x, percentiles)`` give them (the percentiles equal
    to the bit; the mean from an exact integer sum, so at least as exact). With
    `weights` (whole numbers >= 0, their sum not 0), of ``np.repeat(x, weights)``."""
    x = np.ascontiguousarray(x, dtype=np.int64)
    if weights is None:
        return _percentiles(x, None, None, None, x.size, percentiles)
    w = np.ascontiguousarray(weights, dtype=np.int64)
    if w.shape != x.shape or (w < 0).any():
        raise ValueError("weights: one whole number >= 0 per value")
    return _percentiles(x, w, None, None, int(w.sum()), percentiles)


def percentiles_of_batches_ns(per_batch: np.ndarray, batch: np.ndarray, arrival: np.ndarray,
                              served: int, percentiles: tuple[float, ...]
                              ) -> tuple[float, list[float]]:
    """The same of per_batch[batch[i]] - arrival[i] over the `served` requests with
    batch[i] >= 0 (a request's queue time from its batch's start, or its latency from its
    batch's end), read in place: nothing the size of the requests is built."""
    if batch.shape != arrival.shape:
        raise ValueError("batch and arrival: one of each per request")
    return _percentiles(np.ascontiguousarray(per_batch, dtype=np.int64), None,
                        np.ascontiguousarray(batch),
                        np.ascontiguousarray(arrival, dtype=np.int64), served, percentiles)


def _percentiles(x: np.ndarray, w: np.ndarray | None, batch: np.ndarray | None,
                 arrival: np.ndarray | None, n: int, percentiles: tuple[float, ...]
                 ) -> tuple[float, list[float]]:
    if n <= 0:
        raise ValueError("no values")
    if n >= 2**31:
        raise ValueError(f"{n:,} values: at most 2**31 - 1")
    lo, hi, total = _range_and_sum(x, w, batch, arrival)
    mean = total / n
    q = np.true_divide(np.asarray(percentiles, dtype=np.float64), 100)
    virtual = (n - 1) * q
    prev = np.floor(virtual)
    nxt = prev + 1
    above = virtual >= n - 1
    prev_i = np.where(above, n - 1, prev).astype(np.int64)
    next_i = np.where(above, n - 1, nxt).astype(np.int64)
    ranks = np.unique(np.concatenate((prev_i, next_i)))
    values = select_ranks(x, w, batch, arrival, ranks, lo, hi)
    a = values[np.searchsorted(ranks, prev_i)]
    b = values[np.searchsorted(ranks, next_i)]
    gamma = virtual - prev
    diff = b - a
    out = a + diff * gamma
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    return float(mean), [float(v) for v in out]
