"""Arrival processes: rate, variability, traces."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.batching.arrivals import _running_ns, generate_arrivals
from servelab.errors import InputError
from servelab.scenario import scenario_from_dict


def arrivals(tmp_path=".", **w):
    s = scenario_from_dict({"workload": {"num_requests": 200_000, **w}})
    return generate_arrivals(s.workload, np.random.default_rng(1), str(tmp_path))


def cv(a):
    g = np.diff(a.astype(np.float64))
    return g.std() / g.mean()


def test_poisson_rate_and_cv():
    a = arrivals(qps=2000.0)
    assert (np.diff(a) >= 0).all()
    assert a.size / (a[-1] / 1e9) == pytest.approx(2000, rel=0.01)
    assert cv(a) == pytest.approx(1.0, abs=0.01)


def test_constant_is_evenly_spaced():
    a = arrivals(qps=1000.0, arrival="constant")
    assert set(np.diff(a).tolist()) == {1_000_000}


def test_gamma_has_the_asked_cv():
    a = arrivals(qps=1000.0, arrival="gamma", cv=3.0)
    assert a.size / (a[-1] / 1e9) == pytest.approx(1000, rel=0.05)
    assert cv(a) == pytest.approx(3.0, rel=0.05)


def test_trace_csv(tmp_path):
    (tmp_path / "t.csv").write_text("user,arrival_ms\na,5\nb,1.5\nc,2\n")
    a = arrivals(tmp_path, arrival="trace", trace_csv="t.csv")
    assert a.tolist() == [0, 500_000, 3_500_000]  # sorted, from the first arrival
    (tmp_path / "bare.csv").write_text("0.5\n0.25\n")
    assert arrivals(tmp_path, arrival="trace", trace_csv="bare.csv").tolist() == [
        0, 250_000_000]


def test_trace_of_epoch_timestamps_fits_int64(tmp_path):
    (tmp_path / "epoch.csv").write_text("timestamp\n1764500000.25\n1764500000.0\n1764500001.0\n")
    a = arrivals(tmp_path, arrival="trace", trace_csv="epoch.csv")
    assert a.tolist() == [0, 250_000_000, 1_000_000_000]


def test_inline_trace_equals_the_csv(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s\n0.1\n0.4\n0.25\n")
    from_file = arrivals(tmp_path, arrival="trace", trace_csv="t.csv")
    inline = arrivals(tmp_path, arrival="trace", arrivals_s=[0.1, 0.4, 0.25])
    assert from_file.tolist() == inline.tolist() == [0, 150_000_000, 300_000_000]


def test_trace_errors(tmp_path):
    (tmp_path / "t.csv").write_text("when\n1\n")
    with pytest.raises(InputError, match="a column named one of arrival_s"):
        arrivals(tmp_path, arrival="trace", trace_csv="t.csv")
    (tmp_path / "neg.csv").write_text("arrival_s\n-1\n")
    with pytest.raises(InputError, match="finite arrival times >= 0"):
        arrivals(tmp_path, arrival="trace", trace_csv="neg.csv")


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.floats(1e-9, 1e3), st.floats(0.01, 50.0), st.integers(0, 2**32))
def test_running_sum_in_place_equals_numpy(n, mean_gap_s, shape, seed):
    """The compiled running sum writes int64 ns over the gaps' buffer; it must give what
    NumPy's cumsum, scale and rint give, bit for bit."""
    gaps = np.random.default_rng(seed).gamma(shape, mean_gap_s / shape, n)
    want = np.rint(np.cumsum(gaps) * 1_000_000_000).astype(np.int64)
    buf = gaps.copy()
    _running_ns(buf)
    assert np.array_equal(buf.view(np.int64), want)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.floats(1e-3, 1e7), st.lists(st.integers(0, 5000), max_size=6),
       st.integers(0, 2**32))
def test_poisson_drawn_in_parts_equals_one_draw(n, qps, cuts, seed):
    """The engine starts on the first part of the arrivals while the next is drawn: any
    parts give the times one draw of NumPy's exponential gaps gives, bit for bit."""
    from servelab.batching.arrivals import arrival_draw
    from servelab.scenario import Workload

    gaps = np.random.default_rng(seed).exponential(1.0 / qps, n)
    want = np.rint(np.cumsum(gaps) * 1_000_000_000).astype(np.int64)
    drawn = arrival_draw(Workload(qps=qps, num_requests=n), np.random.default_rng(seed))
    for cut in cuts:  # in any order: a part already drawn is not drawn again
        before = drawn.drawn
        drawn.draw(cut)
        assert drawn.drawn == max(before, min(cut, n))
    drawn.draw(n)
    assert np.array_equal(drawn.ns, want)
