"""Percentiles of int64 nanoseconds by radix selection, compiled with Numba.

A Report takes four percentiles and the mean of three arrays of up to millions
of latencies. ``np.percentile`` partitions each array (introselect, several ms a
million values); this finds the same order statistics in two linear
passes, most often: the first takes the range and the sum and counts the values
into 2**11 buckets spanning a small strided sample's range (a histogram that
stays in L1 cache); each later pass counts, into up to 2**16 buckets, only the
values inside the buckets that hold a wanted rank, until each rank's bucket is
one value wide (a bucket of the first pass under 2**16 ns, 65 us, takes one
more). The sample only places the buckets: values outside its range fall into
an open bucket at either end and are narrowed like any other, so the result is
exact whatever the sample. The input is not modified and nothing the size of the
input is allocated. Values may come with whole-number weights (each value
counted that many times): a batch's GPU time weighted by its size has the order
statistics of the per-request GPU times, from a fifth as many values. Or they
may be read in place from the batch records, a request's batch start or end less
its arrival: its queue time or its latency, without an array of them.

The percentile from the order statistics is NumPy's default ``linear`` method
(Hyndman and Fan's 7th), written as NumPy 2 computes it, so the two agree to
the bit (a hypothesis test holds them equal). Values must lie within 2**63 of
each other (any latency in nanoseconds does).
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


_FIRST_BITS = 11  # the first pass: 2**11 buckets (16 KiB of counts) over the sample's range
_SAMPLE = 4096  # values in the strided sample that places them


@njit(cache=True, nogil=True, inline="always")
def _bucket(v: Any, base: Any, shift: Any, nb: Any) -> Any:
    """0 below `base`, 1..nb for the buckets of 2**shift from it, nb + 1 above them."""
    return min(max((v - base) >> shift, np.int64(-1)), nb) + 1


@njit(cache=True, nogil=True)
def _first_pass(x: np.ndarray, w: Any, batch: Any, arrival: Any, base: int, shift: int,
                nb: int) -> tuple[Any, Any, float, np.ndarray]:
    """Minimum, maximum, the sum, and the count in each of the buckets `_bucket` numbers.
    The sum is exact, in two int64 halves: each value's high 32 bits and low 32 bits
    summed apart hold any int64 values for up to 2**31 of them, weights included; one
    rounding when the halves are joined."""
    counts = np.zeros(nb + 2, np.int64)
    lo = np.int64(2**63 - 1)
    hi = np.int64(-(2**63))
    high = np.int64(0)
    low = np.int64(0)
    if batch is not None:
        for i in range(batch.size):
            b = batch[i]
            if b >= 0:
                v = x[b] - arrival[i]
                lo, hi, high, low = _tally(lo, hi, high, low, v, 1)
                counts[_bucket(v, base, shift, nb)] += 1
    elif w is not None:
        for i in range(x.size):
            c = w[i]
            if c > 0:
                v = x[i]
                lo, hi, high, low = _tally(lo, hi, high, low, v, c)
                counts[_bucket(v, base, shift, nb)] += c
    else:
        for v in x:
            lo, hi, high, low = _tally(lo, hi, high, low, v, 1)
            counts[_bucket(v, base, shift, nb)] += 1
    high += low >> 32
    return lo, hi, float(high) * 4294967296.0 + float(low & np.int64(0xFFFFFFFF)), counts


@njit(cache=True, nogil=True)
def _bit_length(v: int) -> int:
    n = 0
    while v > 0:
        v >>= 1
        n += 1
    return n


_CHUNK = 4096  # values gathered from the batch records at a time


_MIXED = -2  # a first-pass bucket that meets more than one interval


@njit(cache=True, nogil=True)
def _count(values: np.ndarray, w: Any, counts: np.ndarray, base: int, shift: int, nb: int,
           first_group: np.ndarray, g_lo: np.ndarray, g_hi: np.ndarray, g_shift: np.ndarray,
           g_at: np.ndarray) -> None:
    """Add each value (w[i] times, or once with w None) to the histogram of the interval it
    falls in, if any. The intervals are disjoint and ascending (interval g's buckets start
    at counts[g_at[g]]); first_group[k] is the one that meets the first pass's bucket k
    (-1: none, _MIXED: several), so most values are passed over after one look-up.
    (Written with branches: a branch-free form with spare counters for the values
    outside measured 1.5-4x slower here, even where a fifth of the values fall inside.)"""
    ng = g_lo.size
    for i in range(values.size):
        v = values[i]
        g = first_group[_bucket(v, base, shift, nb)]
        if g < 0:
            if g != _MIXED:
                continue
            g = 0  # rare: an open bucket, or a pass after the second
            while g < ng - 1 and v > g_hi[g]:
                g += 1
        if g_lo[g] <= v <= g_hi[g]:
            counts[g_at[g] + ((v - g_lo[g]) >> g_shift[g])] += 1 if w is None else w[i]


@njit(cache=True, nogil=True)
def select_ranks(x: np.ndarray, w: Any, batch: Any, arrival: Any, ilo: np.ndarray,
                 ihi: np.ndarray, res: np.ndarray, base: int, shift: int, nb: int
                 ) -> np.ndarray:
    """The values at some ranks (ascending) of the sorted values (see above for w, batch
    and arrival), without sorting or modifying anything: rank j's value lies in
    [ilo[j], ihi[j]] and is the res[j]-th (0-based) of the values there. Each pass
    narrows those intervals (the three arrays are updated in place). base, shift and nb
    are the first pass's buckets (see `_bucket`)."""
    k = ilo.size
    while True:
        # The distinct unresolved intervals (disjoint, in ascending order since the ranks
        # are: two ranks either share an interval or their intervals do not overlap).
        g_lo = np.empty(k, np.int64)
        g_hi = np.empty(k, np.int64)
        g_shift = np.empty(k, np.int64)
        g_at = np.empty(k + 1, np.int64)
        g_of = np.full(k, -1, np.int64)
        ng = 0
        g_at[0] = 0
        for j in range(k):
            if ilo[j] == ihi[j]:
                continue
            if ng > 0 and g_lo[ng - 1] == ilo[j] and g_hi[ng - 1] == ihi[j]:
                g_of[j] = ng - 1
                continue
            g_lo[ng] = ilo[j]
            g_hi[ng] = ihi[j]
            g_shift[ng] = max(0, _bit_length(ihi[j] - ilo[j]) - _BITS)
            g_at[ng + 1] = g_at[ng] + ((ihi[j] - ilo[j]) >> g_shift[ng]) + 1
            g_of[j] = ng
            ng += 1
        if ng == 0:
            return ilo
        first_group = np.full(nb + 2, -1, np.int64)
        for g in range(ng):
            for kb in range(_bucket(g_lo[g], base, shift, nb),
                            _bucket(g_hi[g], base, shift, nb) + 1):
                first_group[kb] = g if first_group[kb] == -1 else _MIXED
        counts = np.zeros(g_at[ng], np.int64)
        groups = (g_lo[:ng], g_hi[:ng], g_shift[:ng], g_at[:ng])
        if batch is None:
            _count(x, w, counts, base, shift, nb, first_group, *groups)
        else:  # gathered a chunk at a time into a buffer that stays in cache
            buf = np.empty(_CHUNK, np.int64)
            for lo_i in range(0, batch.size, _CHUNK):
                m = 0
                for i in range(lo_i, min(lo_i + _CHUNK, batch.size)):
                    b = batch[i]
                    if b >= 0:
                        buf[m] = x[b] - arrival[i]
                        m += 1
                _count(buf[:m], None, counts, base, shift, nb, first_group, *groups)
        for j in range(k):
            g = g_of[j]
            if g < 0:
                continue
            seen = 0
            b = g_at[g]
            while seen + counts[b] <= res[j]:
                seen += counts[b]
                b += 1
            res[j] -= seen
            ilo[j] = g_lo[g] + (np.int64(b - g_at[g]) << g_shift[g])
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
    size = x.size if batch is None else batch.size
    q = np.true_divide(np.asarray(percentiles, dtype=np.float64), 100)
    mean, out = _select(x, w, batch, arrival, n, q, max(1, size // _SAMPLE))
    return float(mean), [float(v) for v in out]


@njit(cache=True, nogil=True)
def _sample_range(x: np.ndarray, w: Any, batch: Any, arrival: Any, step: int
                  ) -> tuple[Any, Any, Any]:
    """The least and greatest of every step-th value (those with no weight or no batch
    left out), and whether there was any."""
    lo = np.int64(2**63 - 1)
    hi = np.int64(-(2**63))
    if batch is not None:
        for i in range(0, batch.size, step):
            b = batch[i]
            if b >= 0:
                v = x[b] - arrival[i]
                lo, hi = min(lo, v), max(hi, v)
    else:
        for i in range(0, x.size, step):
            if w is None or w[i] > 0:
                lo, hi = min(lo, x[i]), max(hi, x[i])
    return lo <= hi, lo, hi


@njit(cache=True, nogil=True)
def _select(x: np.ndarray, w: Any, batch: Any, arrival: Any, n: int, q: np.ndarray,
            step: int) -> tuple[float, np.ndarray]:
    """The mean and the percentiles at fractions q of the n values (see above for w,
    batch and arrival), the sample every step-th value. The percentile from the order
    statistics as NumPy 2 computes its default ``linear`` method, operation by
    operation: a + (b - a) * g, or b - (b - a) * (1 - g) from g = 0.5 on."""
    found, s_lo, s_hi = _sample_range(x, w, batch, arrival, step)
    base, shift, nb = 0, 0, 1  # nothing drawn: every value falls in the open buckets
    if found:
        base = s_lo
        shift = max(0, _bit_length(s_hi - s_lo) - _FIRST_BITS)
        nb = ((s_hi - s_lo) >> shift) + 1
    lo, hi, total, counts = _first_pass(x, w, batch, arrival, base, shift, nb)
    virtual = (n - 1) * q
    prev = np.floor(virtual)
    m = q.size
    prev_i = np.empty(m, np.int64)
    next_i = np.empty(m, np.int64)
    for j in range(m):
        above = virtual[j] >= n - 1
        prev_i[j] = n - 1 if above else np.int64(prev[j])
        next_i[j] = n - 1 if above else np.int64(prev[j] + 1)
    ranks = np.unique(np.concatenate((prev_i, next_i)))
    # Each rank's bucket of the first pass, as an interval of values, and its rank there;
    # the open buckets at either end reach the least and greatest value, and those two
    # ranks are known already.
    ends = np.cumsum(counts)
    k = ranks.size
    ilo = np.empty(k, np.int64)
    ihi = np.empty(k, np.int64)
    res = np.empty(k, np.int64)
    for j in range(k):
        r = ranks[j]
        kb = np.searchsorted(ends, r, side="right")
        res[j] = r - (ends[kb] - counts[kb])
        ilo[j] = lo if kb == 0 else max(lo, base + ((kb - 1) << shift))
        ihi[j] = hi if kb == nb + 1 else min(hi, base + (kb << shift) - 1)
        if r == 0:
            ilo[j], ihi[j], res[j] = lo, lo, 0
        if r == n - 1:
            ilo[j], ihi[j] = hi, hi
    values = select_ranks(x, w, batch, arrival, ilo, ihi, res, base, shift, nb)
    out = np.empty(m, np.float64)
    for j in range(m):
        a = values[np.searchsorted(ranks, prev_i[j])]
        b = values[np.searchsorted(ranks, next_i[j])]
        g = virtual[j] - prev[j]
        diff = b - a
        out[j] = float(b) - float(diff) * (1 - g) if g >= 0.5 else float(a) + float(diff) * g
    return total / n, out
