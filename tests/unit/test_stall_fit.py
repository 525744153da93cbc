"""Reading a server's stalls from its trace (measure/stall_fit.py): by hand, and back
from a simulation whose stalls are known."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.batching.simulate import simulate
from servelab.measure.stall_fit import fit_stalls
from servelab.scenario import scenario_from_dict

MS = 1_000_000


def _requests(batches: list[tuple[int, float, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Each request's (start, end) ns from batches of (start ms, time ms, size)."""
    start, end = [], []
    for s, t, k in batches:
        start += [round(s * MS)] * k
        end += [round((s + t) * MS)] * k
    return np.array(start, np.int64), np.array(end, np.int64)


def test_a_stall_worked_by_hand():
    # six batches of one at 1 ms, one of them at 4 ms; five of two at 1.5 ms, one at 2.5
    batches = [(10.0 * i, 1.0, 1) for i in range(6)] + [(100.0, 4.0, 1)]
    batches += [(200.0 + 10 * i, 1.5, 2) for i in range(5)] + [(300.0, 2.5, 2)]
    fit = fit_stalls(*_requests(batches))
    assert fit is not None
    # 4 ms is 4x the median 1 ms: a 3 ms stall; 2.5 ms is 1.67x 1.5 ms and 1 ms more: a
    # 1 ms stall (both above STALL_FACTOR and STALL_MIN_MS)
    assert fit.stalls == 2
    assert fit.lengths_ms == pytest.approx((1.0, 3.0))
    assert fit.busy_s == pytest.approx((7 * 1.0 + 6 * 1.5) / 1e3)
    # over the span from the first batch's start to the last one's end (0 to 302.5 ms),
    # less the 4 ms of stalls; or over a span given
    assert fit.span_s == pytest.approx(0.3025)
    assert fit.per_s == pytest.approx(2 / (0.3025 - 0.004))
    assert fit_stalls(*_requests(batches), span_s=1.004).per_s == pytest.approx(2.0)
    assert fit.share == pytest.approx(4.0 / (16.0 + 4.0))
    # per size: the batches' time without the stalls, as statistics count them
    assert fit.clean == {1: (7, 7 * MS), 2: (6, 9 * MS)}


def test_no_stall_below_either_threshold():
    # 1.4x its median, and 0.4 ms over a 0.2 ms median (2x, but under 0.5 ms)
    batches = [(10.0 * i, 1.0, 1) for i in range(8)] + [(100.0, 1.4, 1)]
    batches += [(200.0 + 10 * i, 0.2, 3) for i in range(8)] + [(300.0, 0.6, 3)]
    fit = fit_stalls(*_requests(batches))
    assert fit is not None
    assert fit.stalls == 0
    assert fit.per_s == 0


def test_sizes_seen_rarely_take_their_neighbours_time():
    # sizes 1 and 8 seen often (1 ms, 2 ms); one batch of 4 at 1.4 ms is in line, one
    # of 4 at 3.5 ms is a stall of about 2 ms over the line's 1.43 ms
    batches = [(10.0 * i, 1.0, 1) for i in range(6)] + [(100 + 10.0 * i, 2.0, 8)
                                                        for i in range(6)]
    batches += [(300.0, 1.4, 4), (310.0, 3.5, 4)]
    fit = fit_stalls(*_requests(batches))
    assert fit is not None
    assert fit.stalls == 1
    assert fit.lengths_ms[0] == pytest.approx(3.5 - (1.0 + 3 / 7), abs=1e-6)


def test_no_size_seen_often_enough_reads_nothing():
    assert fit_stalls(*_requests([(0.0, 1.0, 1), (5.0, 1.0, 2)])) is None


def test_stalls_read_back_from_a_simulation_that_had_them():
    """A busy server (a constant 1 ms a batch of up to 8) stalling 40 times a second for
    6 ms: the stalls that fell in batches are found, with their lengths; over the
    batches' own time they come at the rate simulated, and over the whole run as many
    as were seen."""
    sc = scenario_from_dict({
        "workload": {"num_requests": 60_000, "qps": 3_000.0, "seed": 3},
        "model": {"kind": "constant", "latency_ms": 1.0},
        "batching": {"max_batch_size": 8, "max_queue_delay_microseconds": 500},
        "hardware": {"num_gpus": 1},
        "latency": {"stalls_per_s": 40.0, "stall_samples_ms": [6.0]}})
    r = simulate(sc).records
    fit = fit_stalls(r.start_ns, r.end_ns)
    assert fit is not None
    assert fit.stalls > 150
    assert fit.stalls / fit.busy_s == pytest.approx(40.0, rel=0.2)
    assert fit.per_s == pytest.approx(fit.stalls / (fit.span_s - fit.stalled_s))
    assert fit.busy_s < fit.span_s - fit.stalled_s < 3 * fit.busy_s
    # a batch holds one stall, or now and then two
    assert set(np.round(fit.lengths_ms, 6)) <= {6.0, 12.0}
    assert np.mean(np.isclose(fit.lengths_ms, 6.0)) > 0.9
    assert fit.clean == {k: (n, n * MS) for k, (n, _) in fit.clean.items()}


def test_the_speed_series_is_each_batch_over_its_sizes_mean_in_order():
    from servelab.measure.stall_fit import speed_series

    # batches of one: 1, 1.2, 0.8 ms ... in this order, then a 4 ms stall; batches of two
    # at 2 ms and one at 3.5 ms, interleaved in time with them
    ones = [1.0, 1.2, 0.8, 1.0, 1.0, 1.0, 4.0]
    twos = [2.0, 3.5, 2.0, 2.0, 2.0, 2.0]
    batches = [(10.0 * i, t, 1) for i, t in enumerate(ones)]
    batches += [(10.0 * i + 5, t, 2) for i, t in enumerate(twos)]
    start, end = _requests(batches)
    raw = speed_series(start, end, clean=False)
    order = sorted(range(len(batches)), key=lambda i: batches[i][0])
    mean1, mean2 = np.mean(ones), np.mean(twos)
    want = [batches[i][1] / (mean1 if batches[i][2] == 1 else mean2) for i in order]
    assert raw == pytest.approx(want)
    # clean: the stall (4 ms, 4x the 1 ms median) counts at its size's usual time
    clean = speed_series(start, end, clean=True)
    ones_clean = [1.0, 1.2, 0.8, 1.0, 1.0, 1.0, 1.0]
    assert clean[order.index(6)] == pytest.approx(1.0 / np.mean(ones_clean))
    assert clean[order.index(0)] == pytest.approx(1.0 / np.mean(ones_clean))
    # 3.5 ms against a 2 ms median: 1.75x and 1.5 ms more, a stall too
    assert clean[order.index(len(ones) + 1)] == pytest.approx(1.0)
    assert speed_series(*_requests([(0.0, 1.0, 1)]), clean=True).size == 0  # seen once


def test_slow_stretches_drawn_in_runs_lengthen_the_tail_that_one_by_one_draws_miss():
    """The same measured multipliers, a slow stretch (1.3x) then a fast one (0.7x): drawn
    one by one they average out batch by batch; drawn in runs the server is slow for a
    while, its queue builds, and p99 grows (issue 28: the gateway's batch times drift over
    tens of batches)."""
    series = [1.3] * 200 + [0.7] * 200

    def p99(block: int) -> float:
        s = scenario_from_dict({
            "workload": {"qps": 1200.0, "num_requests": 60_000, "seed": 1},
            "batching": {"max_batch_size": 8, "max_queue_delay_microseconds": 1000},
            "model": {"kind": "affine", "base_ms": 2.0, "per_row_ms": 0.3,
                      "variability": "empirical", "multipliers": series,
                      "multiplier_block": block},
            "latency": {"network_ms": 0.0, "feature_fetch_ms": 0.0}})
        r = simulate(s).records
        return float(np.percentile((r.end_ns - r.arrival_ns) / 1e6, 99))

    one_by_one, in_runs = p99(1), p99(100)  # 14.2 and 24.4 ms (2026-12-06)
    assert in_runs > 1.4 * one_by_one, (one_by_one, in_runs)
