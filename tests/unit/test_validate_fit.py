"""How `validate` turns measurements into the simulator's inputs: the time outside the
server, and the drift correction between profiling and measuring."""

import numpy as np
import pytest

from servelab.measure.validate import (
    Probe,
    Profile,
    drift_scale,
    notes_for,
    outside_samples,
)


def test_outside_time_pairs_each_request_with_its_own_time_inside():
    # Requests alternately found the instance idle (2 ms inside) or busy (8 ms inside);
    # outside the server each took exactly 0.5 ms. Subtracting the server's *mean* time
    # (5 ms) would put the inside spread outside (-2.5 / +3.5 ms, clipped); pairing does not.
    inside = np.tile([2.0, 8.0], 500)
    latency = inside + 0.5
    out = outside_samples(latency, inside, server_mean_ms=5.0)
    assert out.mean() == pytest.approx(0.5)
    assert out.std() == pytest.approx(0.0, abs=1e-9)


def test_outside_time_mean_is_the_measured_one_when_the_model_is_off():
    # The simulated inside time is 1 ms short of what the server's statistics say (the
    # model's error at low load): the outside mean is still end-to-end less the server's
    # measured mean, not less the simulated one.
    rng = np.random.default_rng(0)
    inside_true = rng.choice([2.0, 8.0], 4000)
    outside_true = rng.gamma(4.0, 0.2, 4000)  # mean 0.8 ms
    latency = inside_true + outside_true
    out = outside_samples(latency, inside_true - 1.0, server_mean_ms=inside_true.mean())
    assert out.mean() == pytest.approx(outside_true.mean(), rel=1e-9)
    assert (out > 0).all()
    # its spread is the outside spread, not the 3 ms of the inside one
    assert out.std() == pytest.approx(outside_true.std(), rel=0.15)


def test_drift_scale_is_the_probe_now_over_the_profiles():
    prof = Profile(probe=Probe((4.0, 4.1, 3.9, 4.0)))
    # one group met a stall: the median ignores it
    now = Probe((4.4, 4.4, 30.0, 4.4, 4.3, 4.5))
    assert now.exec_ms == pytest.approx(4.4)
    assert drift_scale(prof, now) == pytest.approx(1.1)
    assert drift_scale(prof, None) == 1.0
    assert drift_scale(Profile(), now) == 1.0  # nothing to hold it to
    assert drift_scale(prof, Probe((12.0,))) == pytest.approx(3.0)  # noted, not refused


def test_a_large_drift_is_noted_in_words():
    row = {"rate_per_s": 100.0, "probe_drift": 3.0, "measured": {}}
    [note] = [n for n in notes_for([row]) if "100/s" in n]
    assert "+200%" in note
    assert "quieter machine" in note


def _diagnosis_inputs():
    from servelab.measure.load import Target
    from servelab.measure.validate import ServerPolicy
    from servelab.scenario import BatchingPolicy

    t = Target("127.0.0.1", 1, "m")
    sp = ServerPolicy(BatchingPolicy(max_batch_size=8, max_queue_delay_microseconds=2000), 1,
                      "flags")
    prof = Profile(rows_ms={1: 2.0, 2: 2.5, 4: 3.5, 8: 5.5}, per_request_ms=0.1,
                   outside_ms=np.full(200, 0.5))
    offsets = np.cumsum(np.random.default_rng(1).exponential(1 / 300, 3000))
    measured = {"mean_batch": 2.0, "p50_ms": 5.0, "p90_ms": 7.0, "p99_ms": 9.0,
                "mean_ms": 5.5, "achieved_per_s": 300.0, "server_compute_ms": 3.0}
    return t, sp, prof, offsets, measured


def test_the_diagnosis_takes_each_batch_size_the_run_measured():
    """Given the run's own time per batch size, the diagnosis simulates with those times:
    the profile's own times give the plain prediction back; slower ones at the sizes
    the run made (enough batches of them) slow those sizes and scale the rest."""
    from servelab.measure.validate import (
        MIN_RUN_BATCHES,
        fit_scenario,
        given_measured_compute,
        predict,
    )

    t, sp, prof, offsets, measured = _diagnosis_inputs()
    plain = predict(fit_scenario(t, sp, prof), offsets, 0)
    n = MIN_RUN_BATCHES
    # batches of k one-row requests take rows(k) + k x per_request in the model
    as_profiled = {1: (n, int(2.1e6 * n)), 2: (n, int(2.7e6 * n))}
    same = given_measured_compute(t, sp, prof, as_profiled, offsets, 0, measured)
    assert same["profile_scale"] == pytest.approx(1.0, rel=1e-6)
    for k in ("mean_batch", "p50_ms", "p99_ms", "compute_ms"):
        assert same["compare"][k]["predicted"] == pytest.approx(plain[k], rel=1e-4)
    slower = {1: (n, int(2.1e6 * 1.2 * n)), 2: (n, int(2.7e6 * 1.2 * n)),
              3: (n - 1, int(1e9 * n))}  # too few batches of 3: not used
    g = given_measured_compute(t, sp, prof, slower, offsets, 0, measured)
    assert g["profile_scale"] == pytest.approx(1.2, rel=1e-3)
    assert set(g["sizes_ms"]) == {"1", "2"}
    assert g["compare"]["compute_ms"]["predicted"] > plain["compute_ms"] * 1.15
    assert given_measured_compute(t, sp, prof, {}, offsets, 0, measured) is None
