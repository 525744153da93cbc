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
