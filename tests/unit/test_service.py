"""Service-time models, each checked against its formula worked out here."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.batching.service import build_service_model, draw_multipliers, exec_table_ns
from servelab.catalog import get_gpu
from servelab.errors import InputError
from servelab.scenario import Variability, scenario_from_dict

H100 = get_gpu("H100-SXM")


def model(mbs: int = 16, base_dir: str = ".", **spec):
    s = scenario_from_dict({"model": spec})
    return build_service_model(s.model, H100, mbs, base_dir)


def test_constant():
    m = model(kind="constant", latency_ms=2.0)
    assert m.exec_s(np.array([1, 8, 16])).tolist() == [0.002] * 3
    assert m.saturated_rows_per_s(16) == pytest.approx(16 / 0.002)
    assert m.feed(4, 16)[0] == pytest.approx(4 / 16)


def test_affine():
    m = model(kind="affine", base_ms=1.0, per_row_ms=0.25)
    assert m.exec_s(np.array([1, 4]))[1] == pytest.approx(0.002)
    assert m.saturated_rows_per_s(16) == pytest.approx(4000.0)  # 1 / per_row
    assert m.feed(1, 16)[0] == pytest.approx((1 / 0.00125) / 4000)


def test_roofline_compute_and_memory_bound():
    eff = 0.5
    m = model(kind="roofline", flops_per_row=1e11, bytes_per_batch=2e9, overhead_us=100,
              efficiency=eff)
    peak, bw = 989.5e12 * eff, 3.35e12 * eff
    for b in (1, 4, 16):
        expected = max(b * 1e11 / peak, 2e9 / bw) + 1e-4
        assert m.exec_s(b)[0] == pytest.approx(expected)
    assert m.saturated_rows_per_s(16) == pytest.approx(peak / 1e11)
    assert m.mfu(16)[0] == pytest.approx(16 * 1e11 / (m.exec_s(16)[0] * 989.5e12))


def test_roofline_fp8_uses_the_fp8_peak():
    bf = model(kind="roofline", flops_per_row=1e12, efficiency=1.0)
    f8 = model(kind="roofline", flops_per_row=1e12, efficiency=1.0, precision="fp8")
    assert bf.exec_s(1)[0] / f8.exec_s(1)[0] == pytest.approx(1979.0 / 989.5)


def test_profile_points_interpolate_and_extrapolate():
    m = model(kind="profile", points=[[1, 1.0], [4, 1.6], [8, 2.4]])
    assert m.exec_s(np.array([1, 2, 6, 8]) ).tolist() == pytest.approx(
        [1e-3, 1.2e-3, 2.0e-3, 2.4e-3])
    assert m.exec_s(16)[0] == pytest.approx(2.4e-3 + 8 * 0.2e-3)  # last segment's slope
    assert m.saturated_rows_per_s(8) == pytest.approx(8 / 2.4e-3)


def test_profile_from_simple_csv(tmp_path):
    (tmp_path / "p.csv").write_text("batch_size,latency_us\n1,900\n8,1600\n")
    m = model(kind="profile", csv="p.csv", base_dir=str(tmp_path))
    assert m.exec_s(np.array([1, 8])).tolist() == pytest.approx([0.9e-3, 1.6e-3])


PA_HEADER = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
             "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
             "p50 latency,p90 latency,p95 latency,p99 latency,Avg latency,request/response,"
             "response wait\n")


def test_profile_from_perf_analyzer_csvs(tmp_path):
    (tmp_path / "b1.csv").write_text(
        PA_HEADER + "2,900,10,150,40,20,1500,30,5,1800,1900,2000,2100,1760,0,0\n"
                    "1,500,10,150,5,20,1200,30,5,1400,1500,1600,1700,1420,0,0\n")
    (tmp_path / "b8.csv").write_text(
        PA_HEADER + "1,3000,10,150,5,40,2400,60,5,2700,2800,2900,3000,2670,0,0\n")
    m = model(kind="profile", perf_analyzer_csv={"1": "b1.csv", "8": "b8.csv"},
              base_dir=str(tmp_path))
    # compute input + infer + output at the lowest concurrency
    assert m.exec_s(np.array([1, 8])).tolist() == pytest.approx([1.25e-3, 2.5e-3])


def test_profile_csv_errors_are_clear(tmp_path):
    (tmp_path / "p.csv").write_text("bs,ms\n1,2\n")
    with pytest.raises(InputError, match="columns batch_size and latency_ms"):
        model(kind="profile", csv="p.csv", base_dir=str(tmp_path))
    (tmp_path / "pa.csv").write_text("Concurrency,Inferences/Second\n1,20\n")
    with pytest.raises(InputError, match="Server Compute Infer"):
        model(kind="profile", perf_analyzer_csv={"1": "pa.csv"}, base_dir=str(tmp_path))
    with pytest.raises(InputError, match="no such file"):
        model(kind="profile", csv="missing.csv", base_dir=str(tmp_path))


def test_exec_table_and_multipliers():
    m = model(kind="affine", base_ms=1.0, per_row_ms=0.5)
    t = exec_table_ns(m, 4)
    assert t.tolist() == pytest.approx([0, 1.5e6, 2e6, 2.5e6, 3e6])
    rng = np.random.default_rng(0)
    assert (draw_multipliers(Variability.DETERMINISTIC, 0, 5, rng) == 1).all()
    g = draw_multipliers(Variability.GAMMA, 0.2, 200_000, rng)
    assert g.mean() == pytest.approx(1, abs=0.01)
    assert g.std() == pytest.approx(0.2, abs=0.01)
    e = draw_multipliers(Variability.EXPONENTIAL, 0, 200_000, rng)
    assert e.mean() == pytest.approx(1, abs=0.01)
    assert e.std() == pytest.approx(1, abs=0.02)


def test_per_request_cost_adds_to_each_request_of_a_batch():
    # Affine: b one-row requests pay 1 ms + 0.1 ms/row + 0.2 ms/request.
    m = model(kind="affine", base_ms=1.0, per_row_ms=0.1, per_request_ms=0.2)
    assert m.exec_s(np.array([1, 32])).tolist() == pytest.approx([1.3e-3, 10.6e-3])
    assert m.saturated_rows_per_s(32) == pytest.approx(1 / 0.3e-3)
    # Profile measured with one b-row request per batch (perf_analyzer -b b): 32 one-row
    # requests take the measured 7.04 ms plus 32 x 0.323 ms = 17.38 ms, the pair.
    p = model(kind="profile", points=[[1, 2.2], [32, 7.04]], per_request_ms=0.323)
    assert p.exec_s(np.array([32]))[0] == pytest.approx(17.376e-3)
    assert p.exec_s(np.array([1]))[0] == pytest.approx(2.523e-3)


def test_empirical_multipliers_resample_measured_stalls():
    # Measured batch times over the model's mean: a tight body and one 20x stall in 100.
    measured = [1.0] * 99 + [20.0]
    rng = np.random.default_rng(3)
    d = draw_multipliers(Variability.EMPIRICAL, 0.0, 200_000, rng, tuple(measured))
    assert d.mean() == pytest.approx(1.0, rel=0.02)  # scaled to mean 1
    assert set(np.unique(np.round(d, 9))) == {round(1 / 1.19, 9), round(20 / 1.19, 9)}
    assert (d > 10).mean() == pytest.approx(0.01, abs=0.002)  # the stall comes back 1 in 100


def test_empirical_needs_multipliers_and_only_then():
    with pytest.raises(InputError, match="multipliers exactly when variability = 'empirical'"):
        model(kind="constant", latency_ms=1.0, variability="empirical")
    with pytest.raises(InputError, match="multipliers exactly when"):
        model(kind="constant", latency_ms=1.0, multipliers=[1.0, 2.0])
    with pytest.raises(InputError, match="multipliers"):
        model(kind="constant", latency_ms=1.0, variability="empirical", multipliers=[-1.0])


def test_empirical_multipliers_in_runs_keep_their_order():
    """multiplier_block > 1 draws runs of consecutive measured multipliers from random
    starts (wrapping round): each run is a stretch of the measured series, in order."""
    measured = np.arange(1.0, 101.0)  # 1..100, each its own value
    d = draw_multipliers(Variability.EMPIRICAL, 0.0, 1_003, np.random.default_rng(5),
                         tuple(measured), block=10)
    assert d.size == 1_003
    scaled = np.round(d * measured.mean(), 9)  # back to the measured values
    for run in range(0, 1_000, 10):
        steps = np.diff(scaled[run:run + 10])
        assert set(np.unique(steps)) <= {1.0, -99.0}  # the next one, or round to the first
    many = draw_multipliers(Variability.EMPIRICAL, 0.0, 200_000, np.random.default_rng(6),
                            tuple(measured), block=10)
    assert many.mean() == pytest.approx(1.0, rel=0.02)  # scaled to mean 1
    # one at a time, as before: the same draws as without a block
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    assert (draw_multipliers(Variability.EMPIRICAL, 0.0, 50, rng_a, tuple(measured))
            == draw_multipliers(Variability.EMPIRICAL, 0.0, 50, rng_b, tuple(measured),
                                block=1)).all()


def test_multiplier_block_is_for_measured_multipliers_and_bounded():
    with pytest.raises(InputError, match=r"multiplier_block = 5: expected 1 unless"):
        model(kind="constant", latency_ms=1.0, multiplier_block=5)
    for bad in (0, 100_001, 2.5, True):
        with pytest.raises(InputError, match="multiplier_block"):
            model(kind="constant", latency_ms=1.0, variability="empirical",
                  multipliers=[1.0, 2.0], multiplier_block=bad)
    s = scenario_from_dict({"model": {"kind": "constant", "latency_ms": 1.0,
                                      "variability": "empirical", "multipliers": [1.0, 2.0],
                                      "multiplier_block": 50}})
    assert s.model.multiplier_block == 50
