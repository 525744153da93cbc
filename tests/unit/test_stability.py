"""Stable measurements as perf_analyzer takes them (measure/stability.py): windows until
the last three agree, joined end to end into one step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.errors import InputError
from servelab.measure.loadgen import LoadResult
from servelab.measure.stability import STABILITY_WINDOW, Stability, joined, take


def window_of(n: int, per_s: float, latency_ms: float, start_ns: int = 0) -> LoadResult:
    """n requests sent evenly at `per_s`, each answered `latency_ms` after it was due."""
    intended = start_ns + (np.arange(n) * 1e9 / per_s).astype(np.int64)
    return LoadResult(intended, intended, intended + int(latency_ms * 1e6),
                      np.full(n, 200))


def test_three_windows_agree_within_the_percentage_on_throughput_and_latency():
    ten = Stability(10.0)
    assert ten.agree([100, 105, 109], [10.0, 10.5, 10.9])
    assert not ten.agree([100, 105, 111], [10.0, 10.5, 10.9])  # throughput 11% apart
    assert not ten.agree([100, 105, 109], [10.0, 10.5, 11.1])  # latency 11% apart
    assert not ten.agree([100, 105], [10.0, 10.5])  # fewer than three say nothing
    # only the last three count: an early outlier no longer does
    assert ten.agree([50, 100, 105, 109], [90.0, 10.0, 10.5, 10.9])
    assert not ten.agree([100, 105, 109], [10.0, float("nan"), 10.9])
    assert not ten.agree([0, 0, 0], [10.0, 10.0, 10.0])  # nothing answered: not stable
    assert not Stability().agree([100, 100, 100], [10.0, 10.0, 10.0])  # no check asked


def test_windows_run_until_the_last_three_agree_and_the_step_is_those_three():
    # windows' (throughput, latency): noisy at first, then steady
    script = [(100, 30.0), (100, 12.0), (100, 10.0), (101, 10.2), (100, 10.1), (100, 50.0)]
    calls: list[int] = []

    def window(j: int) -> tuple[LoadResult, int]:
        calls.append(j)
        per_s, lat = script[j]
        return window_of(200, per_s, lat), j

    got = take(window, Stability(10.0, max_trials=10))
    assert calls == [0, 1, 2, 3, 4]  # 12, 10, 10.2 is 20% apart; 10, 10.2, 10.1 agree
    assert got.stable is True
    assert got.kept == STABILITY_WINDOW
    assert got.used_extras == (2, 3, 4)
    assert got.summary()["windows"] == 5
    assert joined(got.used).latency_ms.mean() == pytest.approx((10.0 + 10.2 + 10.1) / 3)


def test_a_step_that_never_settles_stops_at_max_trials_and_says_so():
    calls: list[int] = []

    def window(j: int) -> tuple[LoadResult, None]:
        calls.append(j)
        return window_of(100, 100, 10.0 * (j + 1)), None  # latency grows every window

    got = take(window, Stability(10.0, max_trials=4))
    assert calls == [0, 1, 2, 3]
    assert got.stable is False
    assert got.kept == STABILITY_WINDOW  # still the last three, flagged
    assert got.summary()["window_latency_ms"] == pytest.approx([10.0, 20.0, 30.0, 40.0])


def test_without_a_percentage_a_step_is_one_window_unchecked():
    got = take(lambda j: (window_of(50, 100, 5.0), j), Stability())
    assert (got.stable, got.kept, len(got.results)) == (None, 1, 1)


def test_a_percentile_judges_the_windows_by_that_latency():
    # each window: 99 requests at 10 ms and one at 10 ms (steady) or 100 ms (a spike)
    def spiky(j: int) -> tuple[LoadResult, None]:
        r = window_of(100, 100, 10.0)
        done = r.done_ns.copy()
        if j % 2:
            done[-2:] += 90_000_000
        return LoadResult(r.intended_ns, r.sent_ns, done, r.status), None

    by_mean = take(spiky, Stability(25.0, max_trials=5))
    by_p99 = take(spiky, Stability(25.0, max_trials=5, percentile=99))
    assert by_mean.stable is True  # the mean moves 18%
    assert by_p99.stable is False  # the p99 moves 10x


@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"percentage": 0.0}, "--stability-percentage"),
    ({"percentage": float("nan")}, "--stability-percentage"),
    ({"percentage": 10.0, "max_trials": 2}, "--max-trials"),
    ({"percentage": 10.0, "max_trials": 10_000}, "--max-trials"),
    ({"percentage": 10.0, "percentile": 100}, "--percentile"),
])
def test_bad_stability_settings_are_refused_with_the_flag(kwargs, flag):
    with pytest.raises(InputError, match=flag):
        Stability(**kwargs)


def test_joined_windows_are_one_run_end_to_end():
    a = window_of(100, 100, 5.0)  # 0.99 s of sends
    b = window_of(300, 150, 8.0, start_ns=7_000_000_000)  # its own clock, far later
    b.errors["timeout"] = 2
    j = joined([a, b])
    assert j.status.size == 400
    assert j.errors == {"timeout": 2}
    span = (a.done_ns.max() - a.intended_ns.min()) + (b.done_ns.max() - b.intended_ns.min())
    assert j.done_ns.max() - j.intended_ns.min() == span  # the spans add, no gap between
    assert (np.diff(j.intended_ns) >= 0).all()  # sends in order, never overlapping
    assert sorted(j.latency_ms) == pytest.approx(sorted(np.r_[a.latency_ms, b.latency_ms]))
    assert j.summary()["achieved_per_s"] == pytest.approx(400 / (span / 1e9))
    assert joined([a]) is a


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.floats(1, 1000), st.floats(0.01, 500),
                          st.integers(0, 10**12)), min_size=1, max_size=5))
def test_joining_keeps_every_request_and_its_latency(windows):
    parts = [window_of(n, per_s, lat, start) for n, per_s, lat, start in windows]
    j = joined(parts)
    assert j.status.size == sum(p.status.size for p in parts)
    assert np.allclose(np.sort(j.latency_ms), np.sort(np.concatenate([p.latency_ms
                                                                       for p in parts])))
    assert (np.diff(j.intended_ns) >= 0).all()
    assert (j.done_ns - j.intended_ns).min() >= 0
