"""Radix-selected percentiles against NumPy's own, to the bit."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from servelab.order_stats import percentiles_ns
from servelab.report import PERCENTILES

QS = (0, 1, 25, 50, 90, 95, 99, 99.9, 100)


def check(x: np.ndarray, qs: tuple[float, ...] = QS) -> None:
    mean, got = percentiles_ns(x, qs)
    want = np.percentile(x, qs)
    assert got == [float(v) for v in want], (got, want)
    exact = float(Fraction(int(x.astype(object).sum()), x.size))
    assert abs(mean - exact) <= 4 * np.spacing(abs(exact)), (mean, exact)


@settings(max_examples=400, deadline=None)
@given(arrays(np.int64, st.integers(1, 3000),
              elements=st.integers(-(2**61), 2**61)))
def test_equals_numpy_on_any_values(x):
    check(x)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 2**62), st.integers(1, 40), st.integers(0, 2**32))
def test_equals_numpy_on_latency_like_values(n, spread, distinct, seed):
    """Few distinct values (a deterministic GPU time per batch size), wide and narrow
    spreads, heavy ties: the cases a histogram pass has to narrow more than once."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, spread + 1, distinct, dtype=np.int64)
    check(rng.choice(pool, n))
    check(rng.integers(0, spread + 1, n, dtype=np.int64))


def test_a_million_latencies_equal_numpy():
    rng = np.random.default_rng(3)
    x = np.rint(rng.lognormal(15, 0.6, 1_000_000)).astype(np.int64)
    check(x, PERCENTILES)
    check(np.sort(x), PERCENTILES)
    before = x.copy()
    percentiles_ns(x, PERCENTILES)
    assert np.array_equal(x, before)  # the input is left as it was


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 600), st.integers(0, 2**61), st.integers(0, 40), st.integers(0, 2**32))
def test_weighted_values_equal_numpy_on_the_repeated_values(n, spread, most, seed):
    """A batch's GPU time counted once per request in it: the same figures as the
    per-request array, weights of 0 included."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-spread, spread + 1, n, dtype=np.int64)
    w = rng.integers(0, most + 1, n)
    if w.sum() == 0:
        w[0] = 1
    mean, got = percentiles_ns(x, QS, weights=w)
    full = np.repeat(x, w)
    mean_full, want = percentiles_ns(full, QS)
    assert got == want == [float(v) for v in np.percentile(full, QS)]
    assert mean == mean_full


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 800), st.integers(1, 200), st.integers(0, 2**40), st.floats(0, 0.9),
       st.integers(0, 2**32))
def test_values_gathered_from_batches_equal_numpy(n, batches, spread, lost, seed):
    """A request's queue or latency read from its batch's start or end less its arrival,
    in place: the figures of the array Records.served_ns would build (requests with no
    batch, -1, left out)."""
    from servelab.order_stats import percentiles_of_batches_ns

    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.integers(0, spread + 1, n, dtype=np.int64))
    per_batch = rng.integers(0, 2 * spread + 1, batches, dtype=np.int64)
    batch = rng.integers(0, batches, n).astype(np.int32)
    batch[rng.random(n) < lost] = -1
    if (batch < 0).all():
        batch[0] = 0
    served = batch >= 0
    want = per_batch[batch[served]] - arrival[served]
    mean, got = percentiles_of_batches_ns(per_batch, batch, arrival, int(served.sum()), QS)
    assert got == [float(v) for v in np.percentile(want, QS)]
    assert mean == percentiles_ns(want, QS)[0]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 64), st.integers(0, 2**40), st.integers(0, 5),
       st.integers(0, 2**32))
def test_values_outside_the_sample_still_equal_numpy(n, sample, spread, kind, seed):
    """The first pass's buckets span only a strided sample's range: values beyond it fall
    in open buckets at either end, several ranks can share one, and a sample can draw
    nothing at all (every drawn value weightless, or its request unserved). A few
    samples make those the common case; the result must not change."""
    from unittest import mock

    from servelab import order_stats
    from servelab.order_stats import percentiles_of_batches_ns

    rng = np.random.default_rng(seed)
    x = rng.integers(0, spread + 1, n, dtype=np.int64)
    if kind == 1:  # outliers at the positions a stride passes over
        x[1::2] += spread * 4 + 1
    with mock.patch.object(order_stats, "_SAMPLE", sample):
        if kind in (0, 1):
            check(x)
        elif kind == 2:
            w = rng.integers(0, 4, n)
            w[:: max(1, n // sample)] = 0  # the sampled values weigh nothing
            if w.sum() == 0:
                w[-1] = 1
            full = np.repeat(x, w)
            assert percentiles_ns(x, QS, weights=w)[1] == [float(v) for v in
                                                          np.percentile(full, QS)]
        else:
            batch = rng.integers(0, 50, n).astype(np.int32)
            batch[:: max(1, n // sample)] = -1  # the sampled requests were not served
            batch[-1] = max(batch[-1], 0) if (batch < 0).all() else batch[-1]
            per_batch = rng.integers(0, 2 * spread + 1, 50, dtype=np.int64)
            arrival = np.sort(x)
            served = batch >= 0
            want = per_batch[batch[served]] - arrival[served]
            got = percentiles_of_batches_ns(per_batch, batch, arrival, int(served.sum()), QS)
            assert got[1] == [float(v) for v in np.percentile(want, QS)]
