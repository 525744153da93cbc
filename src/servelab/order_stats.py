"""Percentiles of int64 nanoseconds by radix selection, compiled with Numba.

A Report takes four percentiles and the mean of three arrays of up to millions
of latencies. ``np.percentile`` partitions each array (introselect, about 11 ms
a million values here); this finds the same order statistics in three linear
passes: the range and sum, then one histogram pass per 16 bits of the range
(a range under 2**32 ns, 4.3 s, takes two), every wanted rank narrowed in the
same pass. The input is not modified and nothing the size of the input is
allocated.

The percentile from the order statistics is NumPy's default ``linear`` method
(Hyndman and Fan's 7th), written as NumPy 2 computes it, so the two agree to
the bit (a hypothesis test holds them equal).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_BITS = 16  # a histogram of 2**16 buckets per pass and per distinct interval


@njit(cache=True, nogil=True)
def _range_and_sum(x: np.ndarray) -> tuple[int, int, float]:
    """Minimum, maximum and the sum (exact, in two int64 halves: each value's high 32 bits
    and low 32 bits summed apart hold any int64 values for up to 2**31 of them; one
    rounding when the halves are joined)."""
    lo = x[0]
    hi = x[0]
    high = np.int64(0)
    low = np.int64(0)
    mask = np.int64(0xFFFFFFFF)
    for v in x:
        if v < lo:
            lo = v
        elif v > hi:
            hi = v
        high += v >> 32
        low += v & mask
    high += low >> 32
    return lo, hi, float(high) * 4294967296.0 + float(low & mask)


@njit(cache=True, nogil=True)
def _bit_length(v: int) -> int:
    n = 0
    while v > 0:
        v >>= 1
        n += 1
    return n


@njit(cache=True, nogil=True)
def select_ranks(x: np.ndarray, ranks: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The values at 0-based `ranks` (sorted ascending) of the sorted `x`, whose minimum
    and maximum are `lo` and `hi`, without sorting or modifying `x`."""
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
        if ng == 1:  # one interval (always so on the first pass): no search
            shift = g_shift[0]
            for v in x:
                if first <= v <= last:
                    counts[(v - first) >> shift] += 1
        else:
            for v in x:
                if v < first or v > last:
                    continue
                for g in range(ng):
                    if v < g_lo[g]:
                        break
                    if v <= g_hi[g]:
                        counts[g * size + ((v - g_lo[g]) >> g_shift[g])] += 1
                        break
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


def percentiles_ns(x: np.ndarray, percentiles: tuple[float, ...]) -> tuple[float, list[float]]:
    """The mean and the `percentiles` (0-100) of int64 values `x` (not empty), as
    ``x.mean()`` and ``np.percentile(x, percentiles)`` give them (the percentiles equal
    to the bit; the mean from an exact integer sum, so at least as exact)."""
    n = x.size
    x = np.ascontiguousarray(x, dtype=np.int64)
    if n >= 2**31:
        raise ValueError(f"{n:,} values: at most 2**31 - 1")
    lo, hi, total = _range_and_sum(x)
    mean = total / n
    q = np.true_divide(np.asarray(percentiles, dtype=np.float64), 100)
    virtual = (n - 1) * q
    prev = np.floor(virtual)
    nxt = prev + 1
    above = virtual >= n - 1
    prev_i = np.where(above, n - 1, prev).astype(np.int64)
    next_i = np.where(above, n - 1, nxt).astype(np.int64)
    ranks = np.unique(np.concatenate((prev_i, next_i)))
    values = select_ranks(x, ranks, lo, hi)
    a = values[np.searchsorted(ranks, prev_i)]
    b = values[np.searchsorted(ranks, next_i)]
    gamma = virtual - prev
    diff = b - a
    out = a + diff * gamma
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    return float(mean), [float(v) for v in out]
