"""`servelab load` against a stub v2 server whose answer time is known exactly, and
`servelab validate --serve demo` end to end on servelab's own gateway."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from servelab.measure.loadgen import http_request, poisson_offsets, run_open_loop
from servelab.measure.validate import Profile, fitted_rows_ms
from servelab.scenario import ServiceKind, load_scenario
from tests.services import free_port, judged_on_quiet_runs, probe_drift_misses, server_process

STUB = str(Path(__file__).resolve().parent.parent / "stub_v2.py")
BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                               "data": [0.0, 1.0, 2.0, 3.0]}]}).encode()


def stub(*args: str):  # type: ignore[no-untyped-def]
    port = free_port()
    return port, server_process([sys.executable, STUB, str(port), *args],
                                f"http://127.0.0.1:{port}/v2/health/ready")


def test_open_loop_percentiles_match_a_known_delay():
    """20 ms in the stub (its loop's timers round up to the millisecond) plus loopback
    HTTP. The percentiles are wall times on a shared VM: up to three runs, judged at the
    first that holds every bound (a load generator that adds time misses every run)."""
    port, proc = stub("--delay-ms", "20")
    tries = []
    with proc:
        req = [http_request("127.0.0.1", port, "/v2/models/stub/infer", BODY)]
        for seed in (1, 2, 3):
            res = asyncio.run(run_open_loop("127.0.0.1", port, req,
                                            poisson_offsets(100, 300, seed)))
            lat = res.latency_ms
            assert lat.size == 300
            assert not res.errors
            p50, p90, p99 = np.percentile(lat, [50, 90, 99])
            late50, late99 = np.median(res.behind_ms), np.percentile(res.behind_ms, 99)
            tries.append((round(p50, 2), round(p90, 2), round(p99, 2), round(late50, 2),
                          round(late99, 2)))
            # Sends leave on time: typically 0.1-0.5 ms late (the loop's own timers would
            # make it 0.6 ms on average); a busy machine can hold one back a few ms.
            if (19.9 <= p50 <= 23.5 and p90 <= 26.0 and p99 <= 40.0  # hiccups live at p99
                    and late50 < 1.0 and late99 < 20.0):
                return
    raise AssertionError(f"every run missed (p50, p90, p99, late p50, late p99 ms): {tries}")


def test_open_loop_keeps_its_rate_through_a_stall_and_charges_it():
    port, proc = stub("--delay-ms", "5", "--stall-at", "1.0", "--stall-ms", "300")
    offsets = poisson_offsets(200, 500, 2)
    with proc:
        req = [http_request("127.0.0.1", port, "/v2/models/stub/infer", BODY)]
        res = asyncio.run(run_open_loop("127.0.0.1", port, req, offsets))
    assert (res.status == 200).all()
    # The sender did not wait for the stalled answers (that would make ~300 ms of lateness):
    # requests left on time.
    assert np.percentile(res.behind_ms, 99) < 20.0
    # Requests meant to go inside the stall waited for its end, and their latency from
    # the intended time says so (no coordinated omission).
    since_first = (res.intended_ns - res.intended_ns[0]) / 1e9
    inside = (since_first > 1.03) & (since_first < 1.27)
    assert inside.sum() > 20
    stall_left_ms = (1.3 - since_first[inside]) * 1e3
    lat = (res.done_ns[inside] - res.intended_ns[inside]) / 1e6
    assert (lat >= stall_left_ms + 5 - 3).all()
    outside = since_first > 1.5
    assert np.median((res.done_ns[outside] - res.intended_ns[outside]) / 1e6) < 10


def test_load_command_on_a_server_without_statistics_and_validate_says_what_it_lacks():
    port, proc = stub("--delay-ms", "10")
    with proc:
        url = f"http://127.0.0.1:{port}"
        out = subprocess.run([sys.executable, "-m", "servelab", "load", "--url", url,
                              "--model", "stub", "--qps", "100", "--num-requests", "200",
                              "--json"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        [row] = json.loads(out.stdout)
        assert row["ok"] == 200
        assert row["errors"] == 0
        assert 9.9 <= row["p50_ms"] <= 13.5
        assert "mean_batch" not in row  # the stub has no statistics: nothing invented
        val = subprocess.run([sys.executable, "-m", "servelab", "validate", "--url", url,
                              "--model", "stub"], capture_output=True, text=True, timeout=60)
        assert val.returncode == 1
        assert val.stderr.count("\n") == 1
        assert "Traceback" not in val.stderr
        assert "max_batch_size, max_queue_delay_us, instances are unknown" in val.stderr
        val = subprocess.run([sys.executable, "-m", "servelab", "validate", "--url", url,
                              "--model", "stub", "--max-batch-size", "8",
                              "--max-queue-delay-us", "100", "--instances", "1"],
                             capture_output=True, text=True, timeout=60)
        assert val.returncode == 1
        assert "no per-batch-size statistics" in val.stderr


def test_load_takes_windows_until_they_agree_as_perf_analyzer_does():
    """--stability-percentage: windows of --num-requests until the last three agree; the
    step is those three joined. A stub stalled 300 ms in its first second never settles
    within three windows at 5% (the stalled window's mean is several times the others'),
    and says so; the same stub, its one stall past, settles at a loose 50%."""
    port, proc = stub("--delay-ms", "5", "--stall-at", "0.5", "--stall-ms", "300")
    with proc:
        url = f"http://127.0.0.1:{port}"
        base = [sys.executable, "-m", "servelab", "load", "--url", url, "--model", "stub",
                "--qps", "200", "--num-requests", "200", "--json"]
        out = subprocess.run([*base, "-s", "5", "--max-trials", "3"], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        [row] = json.loads(out.stdout)
        st = row["stability"]
        assert st["windows"] == 3
        assert st["stable"] is False
        assert row["ok"] == 600  # the three windows together
        assert "did not settle in 3 windows" in out.stderr
        lat = st["window_latency_ms"]
        assert lat[0] > 3 * max(lat[1:])  # the stalled window
        out = subprocess.run([*base, "-s", "50", "--max-trials", "6"], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        [row] = json.loads(out.stdout)
        st = row["stability"]
        assert st["stable"] is True, st
        assert st["windows"] <= 6
        assert row["ok"] == 600
        assert row["p50_ms"] < 10  # the stall, long past, is in none of the three
        bad = subprocess.run([*base, "--max-trials", "5"], capture_output=True, text=True,
                             timeout=60)
        assert bad.returncode != 0
        assert "--stability-percentage" in bad.stderr
        assert "Traceback" not in bad.stderr


def demo_misses(report: dict) -> list[str]:
    """Loose bounds (the README records the real figures): a simulator fitted wrongly
    (policy, profile, outside time) misses these by far. The diagnosis's scenario gives
    the very batches the server ran the server's own compute time (`run_batches`, within
    3%: what went in, apart from the batching; sizes the run made rarely take the run's
    trend line. It held within 1% on the VM of 2026-12-01, and came out 1.0-2.0% short
    at 400/s in three quiet runs on a VM running Python 2.4-2.9x slower, 2026-12-02,
    where the server ran closer to its saturation); on the batches the simulator forms, its
    compute per request also carries the batching's error. On this 2-core machine the
    gateway's batches at 400/s came out 6-8% bigger than the simulator's (half of it the
    client sending late in bunches: `on_sent_times`), which left compute 1-6% short."""
    misses = probe_drift_misses(report)
    for r in report["rates"]:
        c, g = r["compare"], r["given_measured_compute"]
        for k, e, tol in (("mean_batch", c["mean_batch"]["error"], 0.25),
                          ("p50_ms", c["p50_ms"]["error"], 0.25),
                          ("run batches compute_ms", g["run_batches"]["error"], 0.03),
                          ("given compute_ms", g["compare"]["compute_ms"]["error"], 0.08)):
            if not abs(e) < tol:
                misses.append(f"{r['rate_per_s']:g}/s {k} {e:+.1%} (±{tol:.0%})")
    return misses


@pytest.mark.slow
def test_validate_serve_demo_end_to_end(tmp_path):
    """What validate reads and fits is checked on every run; the prediction on runs
    where the CPUs were quiet (tests/services.py: judged_on_quiet_runs)."""
    def run(attempt: int) -> dict:
        out_dir = tmp_path / f"v{attempt}"
        out = subprocess.run(
            [sys.executable, "-m", "servelab", "validate", "--serve", "demo", "--rates",
             "100,400", "--duration", "4", "--out", str(out_dir), "--json"],
            capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        report = json.loads(out.stdout)
        check_demo_report(report, out_dir)
        return report

    judged_on_quiet_runs(run, demo_misses)


def check_demo_report(report: dict, out_dir: Path) -> None:
    prof = report["profile"]
    rows_ms = {int(k): v for k, v in prof["rows_ms"].items()}
    assert sorted(rows_ms) == [1, 2, 4, 8, 16, 32]
    # This MLP reads its weights once a batch and computes per row: 32 rows take longer
    # than 1, but far less than 32 times as long.
    assert rows_ms[1] < rows_ms[32] < 8 * rows_ms[1]
    assert prof["per_request_ms"] >= 0
    assert prof["calibration"] is None  # not asked for
    assert prof["outside_ms"]["samples"] == 500
    fitted = load_scenario(out_dir / "scenario.toml")
    assert fitted.model.kind is ServiceKind.PROFILE
    # The scenario carries the profile: at 32 the 32-row request's time, or, where
    # batches of 32 one-row requests were measured directly, that time less 32 x the
    # per-request term (so the simulator reproduces the direct measurement).
    requests_ms = {int(k): v for k, v in prof["requests_ms"].items()}
    want = fitted_rows_ms(Profile(rows_ms=rows_ms, requests_ms=requests_ms,
                                  per_request_ms=prof["per_request_ms"]))
    assert dict(fitted.model.points) == pytest.approx(want, rel=1e-3)
    assert fitted.batching.max_batch_size == 32
    assert fitted.batching.max_queue_delay_microseconds == 2000
    assert len(fitted.latency.network_samples_ms) == 500
    assert (out_dir / "validation.html").stat().st_size > 1000
    assert (out_dir / "plotly.min.js").exists()  # the page opens offline
    assert [r["rate_per_s"] for r in report["rates"]] == [100, 400]
    assert report["saturation_per_s"] is None  # no search: --rates, and not --calibrate
    for r in report["rates"]:
        assert r["measured"]["errors"] == 0
        assert r["compare"]["throughput_per_s"]["error"] == pytest.approx(0, abs=0.05)
        # by default each rate is predicted from a warm-up at that rate (issue 28, item
        # 3): half its requests, its own arrivals, every one accounted for; the server's
        # batch times in it replace the profile's for that rate, the profile's own
        # prediction beside it
        w = r["warmup"]
        assert w["measured"]["requests"] == r["requests"] // 2
        assert w["measured"]["errors"] == 0
        assert w["measured"]["ok"] + w["measured"]["errors"] == w["measured"]["requests"]
        assert all(n >= 20 for n in w["batches"].values())
        assert w["sizes_ms"]["1"] > 0
        assert set(r["closed_loop_profile"]) == set(r["compare"])
        # the warm-up held to the run as a prediction: does the measurement repeat?
        held = w["as_prediction"]
        assert held["p50_ms"]["measured"] == r["measured"]["p50_ms"]
        assert held["p50_ms"]["predicted"] == w["measured"]["p50_ms"]
        assert held["mean_batch"]["measured"] == r["measured"]["mean_batch"]
        repeated = all(c["ok"] is not False for c in held.values())
        assert repeated != any(n.startswith(f"at {r['rate_per_s']:g}/s the measurement did "
                                            "not repeat") for n in report["notes"])
        # ... and the stalls in the warm-up's batches are read from the gateway's trace
        # (the run's requests written within half a second): every batch of the warm-up
        st = w["stalls"]
        assert st is not None
        assert st["batches"] >= r["requests"] // 2 // 32
        assert (st["stalls"] > 0) == ("without_stalls" in r)
        # ... and so is the hand-off between batches (measure/handoff.py): the gateway's
        # instance thread takes the next batch within a fraction of a millisecond
        ho = w["handoff"]
        assert ho is not None
        assert ho["turnaround_gaps"] >= 0
        assert all(0 <= v < 5 for v in ho["turnaround_ms"].values()), ho
        assert ho["batcher_first"] is None or 0 <= ho["batcher_first"] <= 1
        assert set(r["without_handoff"]) == set(r["compare"])
        # ... and its batch times in their order, drawn in runs (stall_fit.speed_series)
        se = w["series"]
        assert se is not None
        assert se["batches"] >= st["batches"] // 2, (se, st)
        assert 0 < se["cv"] < 5
        assert set(r["without_series"]) == set(r["compare"])
        rate = f"{r['rate_per_s']:g}"
        assert any(n.startswith(f"at {rate}/s predicted with the batch times of a warm-up")
                   for n in report["notes"]), report["notes"]
        assert any(n.startswith(f"at {rate}/s the warm-up's trace showed")
                   for n in report["notes"]), report["notes"]
        # ... and where the warm-up's time went, from the trace and the load generator,
        # beside the prediction's scenario on the warm-up's send times
        split = w["split"]
        assert set(split) == {"measured", "simulated"}
        for side in split.values():
            assert set(side) == {"sent late", "send to queue entry", "queue", "compute",
                                 "batch end to answer"}
            assert side["compute"]["p50"] > 0
            assert side["queue"]["p50"] >= 0
        assert split["measured"]["sent late"]["p50"] >= 0
        assert any(n.startswith(f"at {rate}/s the warm-up's time went")
                   for n in report["notes"]), report["notes"]
        # ... and the event loop's costs at this rate, read from the warm-up's median
        # latency, with the prediction on the costs fitted at low load kept beside it
        assert 0.25 <= r["frontend_scale"] <= 4.0
        assert set(r["fixed_frontend"]) == set(r["compare"])
        assert any(n.startswith(f"at {rate}/s the front end's costs read x")
                   for n in report["notes"]), report["notes"]
    # 200 requests at 100/s: batches of one request, far more than 20 of them
    assert report["rates"][0]["warmup"]["batches"]["1"] >= 20


@pytest.mark.slow
def test_validate_holds_the_prediction_to_the_last_three_windows_when_asked():
    """--stability-percentage: each rate is measured in windows; at 0.001% four windows
    never agree, so the rate is the last three together, flagged, and the prediction,
    the diagnosis and the server's batches are over exactly those three (600 requests,
    every one of them in a batch the server counted), not the fourth one before them."""
    out = subprocess.run(
        [sys.executable, "-m", "servelab", "validate", "--serve", "demo", "--rates", "150",
         "--duration", "1", "--stability-percentage", "0.001", "--max-trials", "4",
         "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode in (0, 1), out.stderr[-3000:]  # 1: a figure missed
    report = json.loads(out.stdout)
    [r] = report["rates"]
    m = r["measured"]
    assert m["stability"]["windows"] == 4
    assert m["stability"]["stable"] is False
    assert len(m["stability"]["window_latency_ms"]) == 4
    assert m["requests"] == m["ok"] == 600
    run = r["given_measured_compute"]["run_batches"]["batches"]
    assert sum(int(k) * c for k, c in run.items()) == 600
    assert r["compare"]["throughput_per_s"]["error"] == pytest.approx(0, abs=0.05)
    assert any(n.startswith("at 150/s the measurement did not settle in 4 windows")
               for n in report["notes"]), report["notes"]
    assert r["warmup"]["measured"]["requests"] == 100  # the warm-up is one window, as before
    # by default the front end's costs are read from the warm-up, and the prediction with
    # the fitted costs is kept beside it
    assert 0.25 <= r["frontend_scale"] <= 4.0
    assert set(r["fixed_frontend"]) == set(r["compare"])
    assert any(n.startswith("at 150/s the front end's costs read x") for n in report["notes"])


@pytest.mark.slow
def test_validate_calibrates_its_profile_under_open_loop_load_when_asked():
    out = subprocess.run(
        [sys.executable, "-m", "servelab", "validate", "--serve", "demo", "--rates", "100",
         "--duration", "2", "--calibrate", "--json"],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["saturation_per_s"] > 0  # the search ran, for the calibration alone
    closed, prof = report["closed_loop_profile"], report["profile"]
    assert closed["calibration"] is None
    cal = prof["calibration"]
    # the saturation search's open-loop steps ran batches of one-row requests; each size
    # run often enough is taken as measured, less its per-request term
    assert cal["batches"]
    assert all(n >= 20 for n in cal["batches"].values())
    for k, ms in cal["sizes_ms"].items():
        assert prof["rows_ms"][k] == pytest.approx(ms - int(k) * prof["per_request_ms"])
    [r] = report["rates"]
    assert set(r["closed_loop_profile"]) == set(r["compare"])  # the uncalibrated one too
    assert any("calibrated under open-loop load" in n for n in report["notes"])
    assert r["warmup"] is None  # --calibrate turns the warm-up at each rate off


def test_load_replays_a_trace_and_sweeps_a_rate_range(tmp_path):
    trace = tmp_path / "arrivals.csv"
    # 50 arrivals: a burst of 10 at t = 0.5 s, the rest evenly spread over 1 s
    times = sorted([0.5] * 10 + [i / 40 for i in range(40)])
    trace.write_text("arrival_ms\n" + "\n".join(f"{t * 1e3:.3f}" for t in times) + "\n")
    port, proc = stub("--delay-ms", "10")
    with proc:
        url = f"http://127.0.0.1:{port}"
        out = subprocess.run([sys.executable, "-m", "servelab", "load", "--url", url,
                              "--model", "stub", "--arrival", "trace", "--trace", str(trace),
                              "--json"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        [row] = json.loads(out.stdout)
        assert row["requests"] == 50
        assert row["ok"] == 50
        # the burst of 10 left together on ten connections: none waited for another (one
        # after another would take 10 x 10 ms)
        assert row["p99_ms"] < 60
        sweep = subprocess.run([sys.executable, "-m", "servelab", "load", "--url", url,
                                "--model", "stub", "--rates", "50:150:3", "--duration", "1",
                                "--json"], capture_output=True, text=True, timeout=120)
        assert sweep.returncode == 0, sweep.stderr
        assert [r["offered_per_s"] for r in json.loads(sweep.stdout)] == [50, 100, 150]
        for bad in (["--rates", "1:2:0"], ["--rates", "a:b:c"], ["--arrival", "trace"],
                    ["--trace", str(trace)], ["--arrival", "trace", "--trace",
                                              str(tmp_path / "none.csv")]):
            r = subprocess.run([sys.executable, "-m", "servelab", "load", "--url", url,
                                "--model", "stub", *bad], capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 1, (bad, r.stderr)
            assert r.stderr.count("\n") == 1
            assert "Traceback" not in r.stderr


def test_validate_refuses_a_server_that_fails_every_request():
    """A backend that runs and then errors still counts executions in Triton's
    statistics; profiling them would fit the simulator to failures. validate stops at
    the first closed loop with no answer and says what the server said."""
    port, proc = stub("--delay-ms", "1", "--failing")
    with proc:
        val = subprocess.run([sys.executable, "-m", "servelab", "validate", "--url",
                              f"http://127.0.0.1:{port}", "--model", "stub", "--json"],
                             capture_output=True, text=True, timeout=120)
    assert val.returncode == 1
    assert val.stdout == ""
    assert val.stderr.count("\n") == 1, val.stderr
    assert "Traceback" not in val.stderr
    assert "was answered" in val.stderr
    assert "http 500" in val.stderr
    assert "stub: the model failed" in val.stderr
