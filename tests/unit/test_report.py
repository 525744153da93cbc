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
    assert r.plan.cost_per_million_usd == pytest.approx(0.9 / (1000 * 3600) * 1e6)
    assert r.gpu.batch_efficiency == pytest.approx(1.0)  # constant model at its max batch (1)


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
