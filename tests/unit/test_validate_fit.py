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
