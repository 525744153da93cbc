"""How `validate` turns measurements into the simulator's inputs: the time outside the
server, and the drift correction between profiling and measuring."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.measure.validate import (
    Probe,
    Profile,
    drift_scale,
    notes_for,
    outside_samples,
)
from tests.conftest import load_step


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
    from tests.conftest import rate_check

    [note] = [n for n in notes_for([rate_check(100.0, probe_drift=3.0)]) if "100/s" in n]
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
    measured = load_step(achieved_per_s=300.0,
                         server={"mean_batch": 2.0, "server_compute_ms": 3.0})
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
    plain = predict(fit_scenario(t, sp, prof), offsets, 0).to_dict()
    n = MIN_RUN_BATCHES
    # batches of k one-row requests take rows(k) + k x per_request in the model
    as_profiled = {1: (n, int(2.1e6 * n)), 2: (n, int(2.7e6 * n))}
    same = given_measured_compute(t, sp, prof, as_profiled, offsets, 0, measured).to_dict()
    assert same["profile_scale"] == pytest.approx(1.0, rel=1e-6)
    for k in ("mean_batch", "p50_ms", "p99_ms", "compute_ms"):
        assert same["compare"][k]["predicted"] == pytest.approx(plain[k], rel=1e-4)
    slower = {1: (n, int(2.1e6 * 1.2 * n)), 2: (n, int(2.7e6 * 1.2 * n)),
              3: (n - 1, int(1e9 * n))}  # too few batches of 3: not used
    g = given_measured_compute(t, sp, prof, slower, offsets, 0, measured).to_dict()
    assert g["profile_scale"] == pytest.approx(1.2, rel=1e-3)
    assert set(g["sizes_ms"]) == {"1", "2"}
    assert g["batches"] == {"1": n, "2": n}
    assert g["compare"]["compute_ms"]["predicted"] > plain["compute_ms"] * 1.15
    assert given_measured_compute(t, sp, prof, {}, offsets, 0, measured) is None


def test_the_diagnosis_extends_the_runs_own_line_to_the_sizes_it_made_rarely():
    """Sizes the run made too rarely (or not at all) take the count-weighted line through
    the sizes it made often, not the profile's shape: a profile twice as steep as the
    run changes nothing once the run has measured two sizes."""
    from servelab.measure.validate import MIN_RUN_BATCHES, given_measured_compute, with_sizes

    t, sp, prof, offsets, measured = _diagnosis_inputs()
    n = MIN_RUN_BATCHES
    # the run: 2.0 ms + 0.25 ms a request, with 3 n batches of 1 and n of 2
    run = {1: (3 * n, int(2.25e6 * 3 * n)), 2: (n, int(2.5e6 * n)), 6: (1, int(50e6))}
    got = with_sizes(prof, run, n, trend=True)
    assert got is not None
    out, info = got
    assert info.trend_ms is not None
    a, c = info.trend_ms
    assert (a, c) == (pytest.approx(2.0), pytest.approx(0.25))
    for b in (4, 8):  # the profile's sizes the run did not make: on the run's line
        assert out.rows_ms[b] + prof.per_request_ms * b == pytest.approx(2.0 + 0.25 * b)
    steep = replace(prof, rows_ms={b: 2.0 * ms for b, ms in prof.rows_ms.items()})
    assert (given_measured_compute(t, sp, steep, run, offsets, 0, measured).compare
            == given_measured_compute(t, sp, prof, run, offsets, 0, measured).compare)
    # what went in, on the batches the run made: sizes 1 and 2 as measured, the one
    # batch of 6 (50 ms, a stall) on the line at 3.5 ms
    rb = given_measured_compute(t, sp, prof, run, offsets, 0, measured).to_dict()["run_batches"]
    requests = 3 * n + 2 * n + 6
    assert rb["measured_ms"] == pytest.approx((3 * n * 2.25 + 2 * n * 2.5 + 6 * 50) / requests)
    assert rb["scenario_ms"] == pytest.approx((3 * n * 2.25 + 2 * n * 2.5 + 6 * 3.5) / requests,
                                              rel=1e-5)
    assert rb["error"] == pytest.approx(rb["scenario_ms"] / rb["measured_ms"] - 1)
    assert rb["batches"] == {"1": 3 * n, "2": n, "6": 1}
    one = with_sizes(prof, {1: (n, int(2.1e6 * n))}, n, trend=True)
    assert one is not None
    assert one[1].trend_ms is None


def test_the_profile_is_calibrated_by_the_batches_the_server_ran_under_load():
    """The prediction's profile: each batch size the open-loop calibration ran often
    enough is taken as measured (less its per-request term), the others are the
    closed-loop profile's whole time scaled by the count-weighted ratio at the sizes
    seen."""
    from servelab.measure.validate import MIN_CALIBRATION_BATCHES, fitted_rows_ms, under_load

    prof = Profile(rows_ms={1: 2.0, 2: 2.5, 4: 3.5, 8: 5.5}, per_request_ms=0.1,
                   outside_ms=np.full(200, 0.5), probe=Probe((2.0,)))
    n = MIN_CALIBRATION_BATCHES
    # 3 n batches of 1 at 1.4 ms (profile: 2.1), n of 3 at 2.55 ms (profile: 3.0 + 0.3)
    seen = {1: (3 * n, int(1.4e6 * 3 * n)), 3: (n, int(2.55e6 * n)),
            5: (n - 1, int(9e6 * (n - 1)))}  # too few batches of 5: not taken
    cal = under_load(prof, seen)
    scale = (3 * n * 1.4 + n * 2.55) / (3 * n * 2.1 + n * 3.3)
    assert cal.calibration is not None
    assert cal.calibration.profile_scale == pytest.approx(scale)
    assert cal.calibration.batches == {"1": 3 * n, "3": n}
    rows = fitted_rows_ms(cal)
    assert rows[1] == pytest.approx(1.4 - 0.1)
    assert rows[3] == pytest.approx(2.55 - 0.3)
    # the whole time of 8 requests scaled: (5.5 + 8 x 0.1) x scale, less 8 x 0.1
    assert rows[8] == pytest.approx(5.5 * scale + (scale - 1) * 0.8)
    assert 5 not in rows
    assert cal.per_request_ms == prof.per_request_ms
    assert cal.outside_ms is prof.outside_ms
    assert cal.probe is prof.probe
    # nothing run often enough: the closed-loop profile itself
    assert under_load(prof, {2: (n - 1, 10**9)}) is prof
    assert under_load(prof, {}) is prof
    assert "calibrated under open-loop load" in " ".join(notes_for([], cal))
    # a profile that also measured k one-row requests directly (as profile_server does):
    # the calibration's times still win at the sizes it ran
    direct = Profile(rows_ms=prof.rows_ms, requests_ms={3: 3.6}, per_request_ms=0.1,
                     outside_ms=prof.outside_ms, probe=prof.probe)
    rows = fitted_rows_ms(under_load(direct, seen))
    assert rows[3] == pytest.approx(2.55 - 0.3)
    assert rows[1] == pytest.approx(1.4 - 0.1)


def _search(monkeypatch, keeps_up_below: float, closed: float = 1000.0):
    """The saturation search against a server that keeps up below a rate: its steps'
    rates, and what it returns."""
    import servelab.measure.validate as v

    class Closed:
        def summary(self):
            return {"achieved_per_s": closed}

    steps: list[float] = []
    stats: dict[int, tuple[int, int]] = {1: (0, 0)}

    def measure_rate(t, bodies, rate, n, seed, conns):
        steps.append(rate)
        ok = rate < keeps_up_below
        c, ns = stats[1]
        stats[1] = (c + 100, ns + 100 * 2_000_000)  # 100 batches of 1 at 2 ms each step
        return {"achieved_per_s": rate if ok else 0.5 * rate, "drawn_per_s": rate,
                "p50_ms": 5.0, "p50_growth": 1.0}

    monkeypatch.setattr(v, "_closed", lambda *a: Closed())
    monkeypatch.setattr(v, "measure_rate", measure_rate)
    monkeypatch.setattr(v, "batch_stats", lambda t: dict(stats))
    monkeypatch.setattr(v, "random_bodies", lambda *a, **k: [b"x"])
    sp = v.ServerPolicy(v.BatchingPolicy(max_batch_size=8), 1, "flags")
    return steps, v.saturation(None, {}, sp, 5.0)


def test_the_saturation_search_steps_up_and_keeps_what_it_kept_up_with(monkeypatch):
    steps, (sat, closed, kept) = _search(monkeypatch, keeps_up_below=560)
    # up in 10% steps to the first that falls behind twice, then two halvings of the gap
    assert steps == pytest.approx([300, 400, 500, 600, 600, 550, 575, 575])
    assert sat == pytest.approx(550)
    assert closed == 1000
    assert kept == {1: (400, 400 * 2_000_000)}  # the four steps it kept up with


def test_the_saturation_search_steps_down_when_even_the_first_step_falls_behind(
        monkeypatch):
    steps, (sat, _, kept) = _search(monkeypatch, keeps_up_below=100)
    # a fall behind is run twice; then the gap from 75 to 150 halved twice
    assert steps == pytest.approx([300, 300, 150, 150, 75, 112.5, 112.5, 93.75])
    assert sat == pytest.approx(93.75)
    assert kept == {1: (200, 200 * 2_000_000)}  # the steps at 75 and 93.75/s
    steps, (sat, _, kept) = _search(monkeypatch, keeps_up_below=1)
    assert steps == pytest.approx([300, 300, 150, 150, 75, 75, 37.5, 37.5])
    assert kept == {}  # nothing kept up: no calibration


def _queue_search(monkeypatch, capacity: float, search_seed: int,
                  stall_every_s: float = 5.0):
    """The saturation search against a simulated server on the send times the search
    really draws: one FIFO worker, exponential service at `capacity` requests/s, 0.5 ms
    outside it, and a 30 ms stall (a collection, a busy neighbour) every `stall_every_s`
    on average. The closed loop reports 1,000/s."""
    import servelab.measure.validate as v
    from servelab.measure.loadgen import LoadResult, poisson_offsets

    class Closed:
        def summary(self):
            return {"achieved_per_s": 1000.0}

    def measure_rate(t, bodies, rate, n, seed, conns):
        rng = np.random.default_rng(seed + 7919)
        arr = poisson_offsets(rate, n, seed)
        service = rng.exponential(1.0 / capacity, n)
        stalls = rng.random(n) < 1.0 / (stall_every_s * rate)
        service[stalls] += 0.030
        # Lindley's recursion, vectorised: done_i = S_i + max_{j<=i}(arr_j - S_{j-1})
        total = np.cumsum(service)
        done = total + np.maximum.accumulate(arr - (total - service)) + 0.0005
        ns = (arr * 1e9).astype(np.int64)
        res = LoadResult(ns, ns, (done * 1e9).astype(np.int64), np.full(n, 200))
        return res.summary()

    monkeypatch.setattr(v, "_closed", lambda *a: Closed())
    monkeypatch.setattr(v, "measure_rate", measure_rate)
    monkeypatch.setattr(v, "batch_stats", lambda t: None)
    monkeypatch.setattr(v, "random_bodies", lambda *a, **k: [b"x"])
    sp = v.ServerPolicy(v.BatchingPolicy(max_batch_size=8), 1, "flags")
    low_load_p50_ms = 0.5 + 1e3 * np.log(2) / capacity  # the sojourn's median, near idle
    return v.saturation(None, {}, sp, low_load_p50_ms, seed=search_seed)


def test_the_saturation_search_does_not_collapse_by_chance(monkeypatch):
    # Issue 28: a step passed only if it served 97% of the nominal rate, while a 2 s
    # Poisson draw's own span varies by ~3%, so runs against a server that kept up
    # stepped down to 7% of the closed loop. Over 200 searches, each on its own send
    # times, against a server that keeps up to 1.25x the closed loop: none stops below 80%.
    found = np.array([_queue_search(monkeypatch, 1250.0, seed)[0] for seed in range(200)])
    assert found.min() >= 800, np.sort(found)[:10]


def test_the_saturation_search_still_finds_a_server_that_cannot_keep_up(monkeypatch):
    # The same server at half the speed falls behind past 625/s: the search stops there.
    found = np.array([_queue_search(monkeypatch, 625.0, seed)[0] for seed in range(20)])
    assert found.max() <= 625, found
    assert found.min() >= 300, found


def test_a_saturation_far_below_the_closed_loop_is_flagged():
    from servelab.measure.validate import saturation_notes

    assert saturation_notes(1500.0, 1800.0) == []
    assert saturation_notes(None, None) == []
    (note,) = saturation_notes(140.0, 1840.0)
    assert "8% of the closed loop's 1840/s" in note
    assert "--rates" in note


def test_a_queue_that_grows_through_a_run_shows_in_its_p50_growth():
    from servelab.measure.loadgen import LoadResult

    n = 3000
    intended = np.arange(n, dtype=np.int64) * 1_000_000
    ok = np.full(n, 200)
    steady = LoadResult(intended, intended, intended + 5_000_000, ok)
    assert steady.p50_growth() == pytest.approx(1.0)
    growing = LoadResult(intended, intended, intended + 5_000_000 + np.arange(n) * 10_000, ok)
    assert growing.p50_growth() > 3  # 5 -> 35 ms through the run
    # order by intended time, not by position; too few answers say nothing
    rev = LoadResult(intended[::-1], intended[::-1], (intended + 5_000_000 + np.arange(n)
                                                       * 10_000)[::-1], ok)
    assert rev.p50_growth() == pytest.approx(growing.p50_growth())
    few = LoadResult(intended[:20], intended[:20], intended[:20] + 5, ok[:20])
    assert few.p50_growth() == 1.0
    failed = LoadResult(intended, intended, intended + 5, np.zeros(n, dtype=np.int64))
    assert failed.p50_growth() == 1.0
    assert steady.summary()["p50_growth"] == pytest.approx(1.0)


def test_the_diagnosis_also_runs_on_the_times_the_requests_left_the_client():
    """A client that sends late in bursts bunches requests: the diagnosis on the actual
    send times makes bigger batches than on the intended ones, and says so apart
    (mean batch, queue, compute: the figures that do not count from the intended time).
    Sent as intended, the two agree."""
    from servelab.measure.validate import MIN_RUN_BATCHES, given_measured_compute

    t, sp, prof, offsets, measured = _diagnosis_inputs()
    n = MIN_RUN_BATCHES
    run = {1: (3 * n, int(2.25e6 * 3 * n)), 2: (n, int(2.5e6 * n))}
    plain = given_measured_compute(t, sp, prof, run, offsets, 0, measured).to_dict()
    assert "on_sent_times" not in plain
    same = given_measured_compute(t, sp, prof, run, offsets, 0, measured,
                                  sent_s=offsets).to_dict()
    assert set(same["on_sent_times"]) == {"mean_batch", "queue_ms", "compute_ms"}
    assert (same["on_sent_times"]["mean_batch"]["predicted"]
            == pytest.approx(same["compare"]["mean_batch"]["predicted"]))
    # every other request held back to leave with the next: pairs at the same instant
    late = np.sort(np.repeat(offsets[1::2], 2))
    bunched = given_measured_compute(t, sp, prof, run, offsets, 0, measured,
                                     sent_s=late).to_dict()
    assert (bunched["on_sent_times"]["mean_batch"]["predicted"]
            > bunched["compare"]["mean_batch"]["predicted"] * 1.05)


def test_the_front_end_takes_its_work_out_of_the_time_outside():
    """With a front-end station the fitted scenario's time outside is the measured one less
    the station's work, so at low load the two give the measured time outside again; under
    load the station's wait is added on top."""
    from servelab.api import run_simulate
    from servelab.measure.load import Target
    from servelab.measure.validate import ServerPolicy, fit_scenario, outside_after_frontend
    from servelab.scenario import BatchingPolicy

    rng = np.random.default_rng(1)
    outside = 0.4 + rng.gamma(4.0, 0.05, 500)  # every request at least 0.4 ms outside
    prof = Profile(rows_ms={1: 1.0, 2: 1.2}, outside_ms=outside)
    assert outside_after_frontend(prof) == [round(float(x), 4) for x in outside]
    station = replace(prof, frontend_workers=1, frontend_cpu_ms=0.3)
    assert np.allclose(outside_after_frontend(station), outside - 0.3, atol=1e-4)
    t = Target("127.0.0.1", 8000, "m")
    sp = ServerPolicy(BatchingPolicy(max_batch_size=2), 1, "flags")
    fit = fit_scenario(t, sp, station)
    assert (fit.latency.frontend_workers, fit.latency.frontend_cpu_ms) == (1, 0.3)
    assert fit_scenario(t, sp, station, outside=False).latency.frontend is False

    def outside_mean(s, qps: float) -> float:
        c = run_simulate(s.with_overrides({"workload.qps": qps,
                                           "workload.num_requests": 20_000})).latency.components
        return c["frontend"].mean_ms + c["network"].mean_ms

    plain = fit_scenario(t, sp, prof)
    assert outside_mean(fit, 10.0) == pytest.approx(outside_mean(plain, 10.0), rel=0.01)
    # at 2,500/s one worker of 0.3 ms is 75% busy: M/D/1 adds 0.45 ms of wait on average
    assert outside_mean(fit, 2500.0) - outside_mean(plain, 2500.0) == pytest.approx(
        0.75 * 0.3 / (2 * 0.25), rel=0.1)


def test_an_answering_loop_gives_the_low_load_time_outside_again():
    """Split into a parse and an answer (a turn of its own), an event loop's fitted cost
    a request and a turn add up at low load to what the fit saw: a request alone pays
    its parse and its answer and two half turns, and the time outside is the measured one
    less exactly that."""
    from servelab.api import run_simulate
    from servelab.measure.load import Target
    from servelab.measure.validate import (
        ServerPolicy,
        fit_scenario,
        outside_after_frontend,
        split_answer,
    )
    from servelab.scenario import BatchingPolicy

    outside = np.full(200, 0.9)
    loop = Profile(rows_ms={1: 1.0, 2: 1.2}, outside_ms=outside, frontend_workers=1,
                   frontend_event_loop=True, frontend_cpu_ms=0.3, frontend_turn_ms=0.1)
    split_answer(loop, 0.4)
    assert (loop.frontend_cpu_ms, loop.frontend_answer_ms, loop.frontend_turn_ms) == (
        pytest.approx(0.18), pytest.approx(0.12), pytest.approx(0.05))
    assert np.allclose(outside_after_frontend(loop), 0.9 - 0.4, atol=1e-4)
    t = Target("127.0.0.1", 8000, "m")
    sp = ServerPolicy(BatchingPolicy(max_batch_size=2), 1, "flags")
    fit = fit_scenario(t, sp, loop)
    assert fit.latency.frontend_answer_ms == pytest.approx(0.12)
    c = run_simulate(fit.with_overrides({"workload.qps": 5.0, "workload.num_requests": 500})
                     ).latency.components
    assert c["frontend"].p50_ms + c["network"].p50_ms == pytest.approx(0.9, abs=1e-3)
    none = replace(loop, frontend_cpu_ms=0.3, frontend_answer_ms=0.0, frontend_turn_ms=0.1)
    split_answer(none, 0.0)  # no answer: one turn a request, as fitted
    assert (none.frontend_cpu_ms, none.frontend_turn_ms) == (0.3, 0.1)
    assert fit_scenario(t, sp, none).latency.frontend_answer_ms == 0.0


def test_the_front_ends_fitted_cost_is_held_to_what_the_profile_saw_it_pass():
    """The cost read at low load (the server's time beyond queue and compute) is a
    request's, unless the profile's closed loops had more requests a second answered
    than a front end that slow could pass: then a request costs workers / that rate, and
    an event loop's rest is its cost per turn (threads drop it: a stall)."""
    from servelab.measure.validate import frontend_fit, frontend_fit_notes

    prof = Profile(handling_ms=0.6, closed_loop_per_s=1000.0, frontend_workers=1)
    assert frontend_fit(prof) == pytest.approx((0.6, 0.0))
    assert frontend_fit_notes(replace(prof, frontend_cpu_ms=0.6)) == []
    threads = replace(prof, handling_ms=3.0)
    assert frontend_fit(threads) == pytest.approx((1.0, 0.0))
    assert "left out" in frontend_fit_notes(replace(threads, frontend_cpu_ms=1.0))[0]
    loop = replace(threads, frontend_event_loop=True)
    assert frontend_fit(loop) == pytest.approx((1.0, 2.0))  # at low load: 3.0 a request
    note = frontend_fit_notes(replace(loop, frontend_cpu_ms=1.0, frontend_turn_ms=2.0))
    assert "2.000 ms a turn" in note[0]
    assert frontend_fit(replace(threads, frontend_workers=4)) == (
        pytest.approx((3.0, 0.0)))  # four workers at 3 ms pass 1,333/s
    assert frontend_fit(replace(threads, closed_loop_per_s=0.0)) == (3.0, 0.0)
    assert frontend_fit(replace(prof, handling_ms=None)) == (0.0, 0.0)


def test_an_event_loops_turn_cost_is_shared_under_load():
    """A turn of k requests takes turn + k x cpu: at low load (a request a turn) the
    station adds turn + cpu to each request, as the fit's low-load cost; offered more
    than 1 / (turn + cpu) it still keeps up, the turns growing, where a station of
    turn + cpu a request would not."""
    from servelab.api import run_simulate
    from servelab.scenario import scenario_from_dict

    def frontend_ms(qps: float, **lat: object) -> tuple[float, list[str]]:
        s = scenario_from_dict({
            "workload": {"qps": qps, "arrival": "poisson", "num_requests": 20_000},
            "batching": {"max_batch_size": 8, "max_queue_delay_microseconds": 500},
            "model": {"kind": "profile", "points": [[1, 0.05], [8, 0.1]]},
            "latency": {"frontend_workers": 1, "frontend_event_loop": True, **lat}},
            base_dir=None)
        r = run_simulate(s)
        return r.latency.components["frontend"].mean_ms, r.notes

    low, _ = frontend_ms(10.0, frontend_cpu_ms=0.2, frontend_turn_ms=0.6)
    assert low == pytest.approx(0.8, rel=0.05)
    shared, notes = frontend_ms(2000.0, frontend_cpu_ms=0.2, frontend_turn_ms=0.6)
    assert shared < 5.0
    assert not any("cannot keep up" in n for n in notes)
    whole, notes = frontend_ms(2000.0, frontend_cpu_ms=0.8)
    assert any("cannot keep up" in n for n in notes), (whole, notes)


def test_a_warm_up_at_each_rate_is_noted_and_cannot_be_asked_with_the_search_calibration():
    """--calibrate-at-rate (issue 28, item 3): each rate's note names the warm-up's batch
    times and their scale, or says it could not calibrate; with --calibrate as well the
    spec is refused with both flags' names."""
    from dataclasses import replace as with_

    from servelab.errors import InputError
    from servelab.measure.validate import (
        SizeFit,
        ValidationSpec,
        checks_dict,
        warmup_as_prediction,
        warmup_notes,
    )
    from tests.conftest import rate_check

    fit = SizeFit({"1": 1.25, "2": 1.5}, {"1": 40, "2": 22}, 0.8, (1.0, 0.25))
    failed = load_step(requests=100, ok=97, errors=3, errors_by_reason={"timeout": 3})
    rows = [with_(rate_check(100.0), warmup=fit, warmup_measured=load_step()),
            with_(rate_check(400.0), warmup_measured=failed), rate_check(800.0)]
    assert warmup_notes(rows, asked=False) == []
    warm, failures, none, not_run = warmup_notes(rows, asked=True)
    assert warm.startswith("at 100/s predicted with the batch times of a warm-up")
    assert "1: 1.250 ms, 2: 1.500 ms" in warm
    assert "x0.80" in warm
    # every warm-up request is accounted for: its failures are named
    assert failures.startswith("at 400/s the warm-up had 3 failed request(s) of 100")
    assert "timeout" in failures
    assert none.startswith("at 400/s the warm-up ran no batch size 20 times")
    assert not_run.startswith("at 800/s the warm-up ran no batch size")
    with pytest.raises(InputError, match=r"--calibrate-at-rate.*not with --calibrate"):
        ValidationSpec(serve="demo", calibrate=True, calibrate_at_rate=True)
    # on by default, off with --calibrate or --no-calibrate-at-rate
    assert ValidationSpec(serve="demo").at_rate
    assert not ValidationSpec(serve="demo", calibrate=True).at_rate
    assert not ValidationSpec(serve="demo", calibrate_at_rate=False).at_rate
    # ... and with it the front end's speed at the rate, unless asked not to
    assert ValidationSpec(serve="demo").front_end_at_rate
    assert not ValidationSpec(serve="demo", frontend_at_rate=False).front_end_at_rate
    assert not ValidationSpec(serve="demo", calibrate=True).front_end_at_rate
    d = rows[0].to_dict()["warmup"]
    assert d["sizes_ms"] == {"1": 1.25, "2": 1.5}
    assert d["measured"]["requests"] == load_step().requests
    assert rows[1].to_dict()["warmup"] == {
        "measured": failed.to_dict(), "stalls": None, "handoff": None, "series": None,
        "split": None,
        "as_prediction": checks_dict(warmup_as_prediction(rows[1].measured, failed))}
    assert rows[2].to_dict()["warmup"] is None


def test_a_run_that_does_not_repeat_its_own_warm_up_is_flagged():
    """The warm-up at a rate held to the run at that rate as if it were the prediction:
    each figure the target holds gets its error and verdict, in the JSON and, where one
    misses its tolerance, in a note naming the rate, the figure and both values."""
    from dataclasses import replace as with_

    from servelab.measure.validate import repeat_notes, warmup_as_prediction
    from tests.conftest import rate_check

    run = {"p50_ms": 10.0, "p99_ms": 40.0, "server": {"mean_batch": 5.0}}
    close = load_step(p50_ms=10.5, p99_ms=35.0, server={"mean_batch": 4.8})
    far = load_step(p50_ms=7.0, p99_ms=20.0, server={"mean_batch": 4.8})
    c = warmup_as_prediction(load_step(**run), close)
    assert c["p50_ms"].error == pytest.approx(0.05)
    assert c["p50_ms"].ok
    assert c["p99_ms"].error == pytest.approx(-0.125)
    assert c["p99_ms"].ok
    assert c["mean_batch"].error == pytest.approx(-0.04)
    assert c["mean_batch"].ok
    rows = [with_(rate_check(500.0, **run), warmup_measured=close),
            with_(rate_check(1000.0, **run), warmup_measured=far),
            rate_check(1500.0, **run)]  # no warm-up: nothing to hold
    (note,) = repeat_notes(rows)
    assert note.startswith("at 1000/s the measurement did not repeat itself")
    assert "p50 7 against the run's 10 (-30%)" in note
    assert "p99 20 against the run's 40 (-50%)" in note
    assert "mean batch" not in note  # within its 10%
    # a warm-up without the server's statistics: its mean batch is not judged
    bare = warmup_as_prediction(load_step(**run), load_step(p50_ms=10.0, p99_ms=40.0))
    assert bare["mean_batch"].error is None
    assert bare["mean_batch"].ok is None
    assert bare["p50_ms"].ok
    assert bare["p99_ms"].ok


def test_the_warm_ups_stalls_are_read_from_the_gateways_trace_and_simulated(tmp_path):
    """validate reads the stalls of the requests that entered the gateway's queue during
    the warm-up (its trace files, by the monotonic clock), and the fitted scenario
    simulates them; the batch times it takes have the stalls taken out."""
    from servelab.measure.load import Target
    from servelab.measure.validate import (
        MIN_RUN_BATCHES,
        ServerPolicy,
        fit_scenario,
        trace_stalls,
        trace_window,
        with_sizes,
    )
    from servelab.scenario import BatchingPolicy
    from servelab.trace_file import TraceWriter

    ms = 1_000_000
    w = TraceWriter(tmp_path / "trace", every=50)
    for i in range(300):  # one-request batches of 1 ms every 10 ms; every 30th takes 6 ms
        t0 = i * 10 * ms
        w.add("m", t0, t0, t0 + (6 if i % 30 == 29 else 1) * ms)
    w.flush()
    (tmp_path / "trace.7.tmp").write_text("[")  # a file being written: not read
    window = trace_window(tmp_path / "trace", "m", 1_000 * ms, 2_995 * ms)  # requests 100-299
    assert window is not None
    assert window.queue_ns.size == 200
    fit = trace_stalls(window)
    assert fit is not None
    assert fit.batches == 200
    assert fit.stalls == 7
    assert fit.lengths_ms == pytest.approx((5.0,) * 7)
    # over the span read (requests 100 to 299: 1.000 to 2.996 s) less the stalls
    assert fit.span_s == pytest.approx(1.996)
    assert fit.per_s == pytest.approx(7 / (1.996 - 0.035))
    assert fit.clean == {1: (200, 200 * ms)}
    assert trace_window(tmp_path / "trace", "m", 5_000 * ms, 6_000 * ms) is None  # none then
    t = Target("127.0.0.1", 1, "m")
    sp = ServerPolicy(BatchingPolicy(max_batch_size=2), 1, "flags")
    prof = Profile(rows_ms={1: 1.5, 2: 2.0}, outside_ms=np.full(100, 0.5))
    got = with_sizes(prof, fit.clean, MIN_RUN_BATCHES)
    assert got is not None
    stalled = got[0]
    stalled.stalls = fit
    sc = fit_scenario(t, sp, stalled)
    assert sc.latency.stalls_per_s == pytest.approx(fit.per_s, abs=1e-6)
    assert sc.latency.stall_samples_ms == (5.0,) * 7
    assert dict(sc.model.points)[1] == pytest.approx(1.0)  # the 1 ms without the stalls
    assert not fit_scenario(t, sp, stalled, outside=False).latency.stalls
    assert not fit_scenario(t, sp, prof).latency.stalls


def test_the_front_ends_speed_at_a_rate_is_read_back_from_a_warm_up():
    """The front end at the rate: a warm-up measured on a server whose event loop ran
    1.6x its low-load costs (here: simulated so) gives the multiple back from its median
    latency alone; the time outside the front end stays as fitted at low load, so a multiple
    of 1 gives the plain prediction, and the search holds to its range."""
    from servelab.measure.validate import (
        FRONTEND_SCALE_RANGE,
        fit_scenario,
        frontend_scale,
        predict,
    )

    t, sp, prof, _, _ = _diagnosis_inputs()
    loop = replace(prof, frontend_workers=1, frontend_event_loop=True, frontend_cpu_ms=0.6,
                   frontend_turn_ms=0.2, frontend_answer_ms=0.3)
    fast = np.cumsum(np.random.default_rng(2).exponential(1 / 900, 3000))  # near busy
    measured = predict(fit_scenario(t, sp, replace(loop, frontend_scale=1.6)), fast, 0)
    assert frontend_scale(t, sp, loop, fast, 0, measured.p50_ms) == pytest.approx(1.6,
                                                                                 rel=0.01)
    plain = predict(fit_scenario(t, sp, loop), fast, 0)
    assert frontend_scale(t, sp, loop, fast, 0, plain.p50_ms) == pytest.approx(1.0, rel=0.01)
    # the costs scale, the time outside the front end does not
    fit = fit_scenario(t, sp, replace(loop, frontend_scale=2.0))
    base = fit_scenario(t, sp, loop)
    assert fit.latency.frontend_cpu_ms == pytest.approx(2 * base.latency.frontend_cpu_ms)
    assert fit.latency.frontend_turn_ms == pytest.approx(2 * base.latency.frontend_turn_ms)
    assert fit.latency.network_samples_ms == base.latency.network_samples_ms
    lo, hi = FRONTEND_SCALE_RANGE
    assert frontend_scale(t, sp, loop, fast, 0, 0.001) == lo
    assert frontend_scale(t, sp, loop, fast, 0, 1e6) == hi


FIGURE = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(0.0))


@settings(max_examples=300, deadline=None)
@given(run=st.tuples(FIGURE, FIGURE, st.one_of(st.none(), FIGURE)),
       warm=st.tuples(FIGURE, FIGURE, st.one_of(st.none(), FIGURE)))
def test_the_warm_up_held_to_the_run_takes_any_figures(run, warm):
    """Any figures a step can hold (0, NaN, infinities, no server statistics): the
    warm-up held to the run gives an error only where both sides are finite and the
    run's is not 0, a verdict exactly where there is an error, and the note never
    raises."""
    from dataclasses import replace as with_

    from servelab.measure.validate import repeat_notes, warmup_as_prediction
    from tests.conftest import rate_check

    def step(f):  # type: ignore[no-untyped-def]
        p50, p99, batch = f
        return load_step(p50_ms=p50, p99_ms=p99,
                         server={} if batch is None else {"mean_batch": batch})

    checks = warmup_as_prediction(step(run), step(warm))
    for k, c in checks.items():
        judgeable = (c.measured is not None and c.predicted is not None and c.measured != 0
                     and np.isfinite(c.measured) and np.isfinite(c.predicted))
        assert (c.error is not None) == judgeable, (k, c)
        assert (c.ok is None) == (c.error is None), (k, c)
        if c.error is not None:
            assert c.ok == (abs(c.error) <= c.tolerance)
    row = with_(rate_check(100.0, p50_ms=run[0], p99_ms=run[1],
                           server={} if run[2] is None else {"mean_batch": run[2]}),
                warmup_measured=step(warm))
    notes = repeat_notes([row])
    assert len(notes) == int(any(c.ok is False for c in checks.values()))
