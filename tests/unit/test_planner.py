"""The planner: fewest GPUs meeting the SLO, checked against simulations of N-1."""

from __future__ import annotations

from servelab.api import run_plan, run_simulate
from servelab.scenario import load_scenario


def base(**over):
    return load_scenario("seed").with_overrides({"workload.num_requests": 40_000, **over})


def test_fewest_gpus_meet_and_one_fewer_does_not():
    s = base(**{"workload.qps": 40_000.0, "latency.p99_slo_ms": 14.0})
    r = run_plan(s)
    n = r.plan.num_gpus
    assert r.plan.meets_slo
    assert n > 1
    assert r.latency.p99_ms <= 14.0
    fewer = run_simulate(s.with_overrides({"hardware.num_gpus": n - 1}))
    assert not fewer.plan.meets_slo
    assert [st.num_gpus for st in r.plan.search] == sorted({st.num_gpus for st in r.plan.search})
    assert r.plan.closed_form is not None
    assert r.plan.closed_form.num_gpus >= 1


def test_busy_ceiling_adds_gpus():
    loose = run_plan(base(**{"workload.qps": 20_000.0}))
    tight = run_plan(base(**{"workload.qps": 20_000.0}).with_overrides(
        {"plan.max_busy_fraction": 0.3}))
    assert tight.plan.num_gpus > loose.plan.num_gpus
    assert tight.gpu.busy_fraction <= 0.3


def test_slo_below_the_physical_floor_is_explained():
    r = run_plan(base(**{"latency.p99_slo_ms": 7.0}))  # fetch 3 + network 5 > 7
    assert not r.plan.meets_slo
    assert "can never be below" in r.plan.verdict


def test_sweep_with_the_planner_adds_gpus_as_load_grows():
    from servelab.api import run_sweep

    rows = run_sweep(base(), "qps", [2_000, 40_000, 80_000], plan=True)
    gpus = [r["num_gpus"] for r in rows]
    assert gpus == sorted(gpus)
    assert gpus[-1] > gpus[0]
    assert all(r["meets_slo"] for r in rows)
