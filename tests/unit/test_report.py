"""The Report: stable keys, the figures' definitions, determinism."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from servelab.api import run_simulate
from servelab.batching.simulate import simulate
from servelab.report import build_report
from servelab.scenario import load_scenario, scenario_from_dict

STABLE_KEYS = [
    "batching.mean_batch_size", "batching.batch_size_histogram", "latency.mean_queue_ms",
    "latency.p50_ms", "latency.p99_ms", "gpu.busy_fraction", "gpu.batch_efficiency",
    "plan.num_gpus", "plan.cost_per_million_usd", "requests.served", "requests.rejected",
    "requests.timed_out",
]


def get(d, dotted):
    for part in dotted.split("."):
        d = d[part]
    return d


def test_stable_json_keys_and_strict_json():
    d = run_simulate(load_scenario("seed")).to_dict()
    for key in STABLE_KEYS:
        get(d, key)
    json.dumps(d, allow_nan=False)
    hist = d["batching"]["batch_size_histogram"]
    assert sum(int(b) * n for b, n in hist.items()) == d["requests"]["served"]


def test_same_scenario_same_report_bit_for_bit():
    s = load_scenario("seed").with_overrides({"workload.num_requests": 20_000})
    assert run_simulate(s).to_dict() == run_simulate(s).to_dict()
    other = run_simulate(s.with_overrides({"workload.seed": 1})).to_dict()
    assert other["latency"]["p50_ms"] != run_simulate(s).to_dict()["latency"]["p50_ms"]


def test_busy_cost_and_budget_by_hand():
    # Constant arrivals every 1 ms, 0.4 ms per request, no batching: busy = 40% exactly.
    s = scenario_from_dict({
        "workload": {"qps": 1000.0, "arrival": "constant", "num_requests": 10_000},
        "batching": {"max_batch_size": 1},
        "model": {"kind": "constant", "latency_ms": 0.4},
        "hardware": {"gpu": "L4", "num_gpus": 1, "price_per_gpu_hour": 0.9},
        "latency": {"feature_fetch_ms": 3.0, "network_ms": 5.0},
    })
    r = build_report(simulate(s))
    assert r.gpu.busy_fraction == pytest.approx(0.4, rel=1e-3)
    assert r.latency.mean_queue_ms == 0.0
    assert r.latency.p99_ms == pytest.approx(3.0 + 0.4 + 5.0)
    # 10,000 served from t = 0 to the last completion at 10 s + 0.4 ms.
    served_per_s = 10_000 / 10.0004
    assert r.throughput.served_per_s == pytest.approx(served_per_s, rel=1e-9)
    assert r.plan.cost_per_million_usd == pytest.approx(0.9 / (served_per_s * 3600) * 1e6)
    assert r.gpu.batch_efficiency == pytest.approx(1.0)  # constant model at its max batch (1)


def test_overload_throughput_is_served_over_the_span_it_took():
    # The case: 10,000 offered/s into one instance that serves at most
    # 8 rows per 1.0 + 0.8 ms = 4,444/s. The report must not claim the offered rate.
    s = scenario_from_dict({
        "workload": {"qps": 10_000.0, "num_requests": 40_000},
        "batching": {"max_batch_size": 8, "max_queue_delay_microseconds": 500},
        "model": {"kind": "affine", "base_ms": 1.0, "per_row_ms": 0.1},
        "hardware": {"gpu": "H100-SXM", "num_gpus": 1, "price_per_gpu_hour": 2.0},
    })
    sim = simulate(s)
    r = build_report(sim)
    rec = sim.records
    served = rec.served
    by_hand = served.sum() / (rec.end_ns[served].max() / 1e9)
    assert r.throughput.served_per_s == pytest.approx(by_hand, rel=1e-12)
    assert r.throughput.served_per_s == pytest.approx(8 / 1.8e-3, rel=0.01)  # 4,444/s
    assert r.plan.cost_per_million_usd == pytest.approx(2.0 / (by_hand * 3600) * 1e6)
    assert any("cannot keep up" in n for n in r.notes)


def test_timeout_shorter_than_the_window_is_warned():
    s = load_scenario("seed").with_overrides({
        "batching.default_timeout_microseconds": 1000, "workload.qps": 10.0,
        "workload.num_requests": 2_000})
    r = run_simulate(s)
    assert r.requests.timed_out > 0.9 * r.requests.arrivals  # lone requests time out
    assert any("default_timeout_microseconds (1,000 us) is shorter" in n for n in r.notes)
    ok = run_simulate(s.with_overrides({"batching.default_timeout_microseconds": 5000}))
    assert not any("default_timeout_microseconds" in n for n in ok.notes)


def test_latency_components_add_up_in_the_mean():
    r = run_simulate(load_scenario("seed").with_overrides({"workload.num_requests": 20_000}))
    c = r.latency.components
    total = sum(c[k].mean_ms for k in ("feature_fetch", "queue", "gpu", "network"))
    assert total == pytest.approx(r.latency.mean_ms)


def test_lognormal_component_through_median_and_p99():
    s = load_scenario("seed").with_overrides({
        "latency.feature_fetch_ms": 2.0, "latency.feature_fetch_p99_ms": 6.0,
        "workload.num_requests": 200_000})
    f = run_simulate(s).latency.components["feature_fetch"]
    assert f.p50_ms == pytest.approx(2.0, rel=0.02)
    assert f.p99_ms == pytest.approx(6.0, rel=0.03)


def test_overload_is_reported_not_hidden():
    s = load_scenario("seed").with_overrides({"workload.qps": 60_000.0, "hardware.num_gpus": 1,
                                              "workload.num_requests": 50_000})
    r = run_simulate(s)
    assert not r.plan.meets_slo
    assert any("cannot keep up" in n for n in r.notes)
    assert math.isfinite(r.latency.p99_ms)


def test_rejections_and_timeouts_counted():
    s = load_scenario("seed").with_overrides({
        "workload.qps": 30_000.0, "hardware.num_gpus": 1, "workload.num_requests": 50_000,
        "batching.max_queue_size": 100, "batching.default_timeout_microseconds": 3000})
    r = run_simulate(s)
    q = r.requests
    assert q.rejected > 0
    assert q.timed_out > 0
    assert q.served + q.rejected + q.timed_out == q.arrivals
    assert "requests rejected or timed out" in r.plan.verdict
    assert np.isfinite(r.plan.cost_per_million_usd)


def test_measured_latency_samples_reach_the_tail():
    # Network measured as 2 ms with a 40 ms stall one time in 50: p99 of the end to end
    # carries the stall; a log-normal through the same median would not.
    samples = [2.0] * 49 + [40.0]
    s = load_scenario("seed").with_overrides({
        "workload.num_requests": 50_000, "latency.network_samples_ms": samples,
        "latency.feature_fetch_ms": 0.0})
    r = run_simulate(s)
    net = r.latency.components["network"]
    assert net.p50_ms == pytest.approx(2.0)
    assert net.p99_ms == pytest.approx(40.0)
    assert r.latency.p99_ms > 40.0
    assert s.latency.median_p99_ms("network") == (2.0, pytest.approx(21.38))


def test_an_inline_trace_offers_its_own_rate_not_the_unused_qps():
    """arrivals_s given inline: qps plays no part, so the report's offered rate is the
    trace's own (as for a trace file), not the default qps."""
    from servelab.api import load, run_simulate

    s = load("seed", {"workload.arrival": "trace", "workload.qps": 12345.0,
                      "workload.arrivals_s": [i * 0.01 for i in range(101)]})
    offered = run_simulate(s).throughput.offered_qps
    assert offered == pytest.approx(101 / 1.0)


def test_the_p99_interval_covers_the_long_run_p99():
    """The Report's p99 interval (asked for: run_simulate(..., p99_interval=True)) is a
    95% interval by batch means: over 20 short runs on other seeds it holds a 1,000,000-
    request run's p99 in at least 15 (binomial at 95%: fewer than 15 has odds ~3e-4)."""
    from servelab.api import load, run_simulate

    def at(n: int, seed: int) -> object:
        return load("seed", {"workload.num_requests": n, "workload.seed": seed,
                             "workload.qps": 8000})

    truth = run_simulate(at(1_000_000, 999)).latency.p99_ms
    held = 0
    for seed in range(20):
        lo, hi = run_simulate(at(20_000, seed), p99_interval=True).latency.p99_interval_ms
        held += lo <= truth <= hi
    assert held >= 15, held
    assert run_simulate(at(500, 0), p99_interval=True).latency.p99_interval_ms == (None, None)
