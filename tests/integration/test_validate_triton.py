"""`servelab validate --url` against a real Triton (PyTriton's bundled server, CPU): the
policy is read from Triton's own config endpoint, the model is profiled from Triton's
statistics, and the simulator, fitted to that, predicts what the load then measures.

Tolerances here are looser than the project's fidelity target (the README records the
measured errors and what limits them on a 2-core machine shared with the client); they
fail if validate reads the wrong policy, mis-profiles the model or mis-fits the batch.
The real-Triton replay of a trace (the second test) holds the closing rule itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from servelab.errors import StoreError
from servelab.measure.loadgen import MALFORMED_HEAD
from tests.services import (
    QUIET_OTHERS,
    QUIET_STEAL,
    HostUse,
    free_port_run,
    judged_on_quiet_runs,
    probe_drift_misses,
    server_process,
    skip_host_busy,
)

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "triton_sleep_server.py"


def pytriton_python() -> str | None:
    given = os.environ.get("SERVELAB_PYTRITON_PYTHON")
    py = Path(given) if given else ROOT / ".venv-pytriton" / "bin" / "python"
    if not py.exists():
        return None
    ok = subprocess.run([str(py), "-c", "import pytriton"], capture_output=True)
    return str(py) if ok.returncode == 0 else None


def pytriton_env(py: str) -> dict[str, str]:
    """This process's environment with the PyTriton interpreter's own lib folder on
    LD_LIBRARY_PATH (its bundled tritonserver links libpython from there)."""
    libdir = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_config_var("
                             "'LIBDIR'))"], capture_output=True, text=True).stdout.strip()
    return {**os.environ, "LD_LIBRARY_PATH": libdir}


def still_answers(port: int) -> bool:
    """Whether Triton answers one inference within 10 s."""
    from servelab.measure.client import fetch
    from servelab.measure.load import metadata, parse_url, random_bodies

    try:
        t = parse_url(f"http://127.0.0.1:{port}", "sleep")
        body = random_bodies(metadata(t), 1, 0)[0]
        assert isinstance(body, bytes)
        return fetch("POST", f"{t.base}/v2/models/sleep/infer", body=body,
                     timeout_s=10.0).status == 200
    except StoreError:
        return False


def run_against_triton(py: str, argv_for: Callable[[int], list[str]], *extra: str,
                       timeout_s: float = 600, before_stop: Callable[[], object] | None = None
                       ) -> subprocess.CompletedProcess[str]:
    """Start PyTriton's Triton (once more if its own start fails on a loaded machine, if
    it exits while the command runs, or if it stops answering: a CI run of 2026-12-06 had
    it refuse connections in the middle of a validate run's profile, and a clean-clone run
    the same day had it answer 640 requests of a 400/s run and none after, its trace
    stopped too; a later CI run that day had validate wait on it past 600 s, before
    validate stopped a run the server answers nothing of for a request's timeout; a CI
    run of 2026-12-07 had it hang at 400/s in one attempt and refuse connections in the
    next, where the test alone passed in 52 s right after: three attempts), run the
    servelab command argv_for(port) against it, call `before_stop` while it still runs,
    stop it."""
    env = pytriton_env(py)
    attempts = 3
    for attempt in range(attempts):
        port = free_port_run(3)  # HTTP, GRPC, metrics
        try:
            with server_process([py, str(SERVER), str(port), *extra],
                                f"http://127.0.0.1:{port}/v2/models/sleep/ready",
                                timeout_s=120, env=env) as proc:
                try:
                    done = subprocess.run([sys.executable, "-m", "servelab",
                                           *argv_for(port)], capture_output=True, text=True,
                                          timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    if still_answers(port):
                        raise  # the command's own hang, not the server's
                    raise StoreError(f"the command ran past {timeout_s:g} s and the server "
                                     "no longer answers inferences") from None
                if proc.poll() is not None:  # the server, not the command, failed
                    raise StoreError(f"the server exited (code {proc.returncode}) while "
                                     f"the command ran; it said: {done.stderr[-600:]}")
                if not still_answers(port):
                    raise StoreError("the server stopped answering inferences while the "
                                     f"command ran; it said: {done.stderr[-600:]}")
                if before_stop is not None:
                    before_stop()
                return done
        except StoreError as exc:  # it did not start (the command's own errors are not this)
            print(f"attempt {attempt + 1}: {exc}", file=sys.stderr)
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def fidelity_misses(report: dict) -> list[str]:
    """Where the prediction misses: the whole one's mean batch by 40% or more (a wrong
    policy or a gross misfit), or the simulator given each batch size's time as the
    server measured it in the run the issue's tolerances.

    What went in is held within 5%: the diagnosis' times weighted by the batches the
    server itself ran (`run_batches`), against its own compute per request. The
    simulated compute per request is held within 10%, as the mean batch is: it is
    weighted by the batches the simulator forms, so it misses with them (a CI run in
    session 9, quiet by steal, had it 5.1-5.4% short at 400/s beside a mean batch 3.5-3.7%
    short; with client and server on one core, session 10, 1.5-4.8% beside 7-8%)."""
    misses = probe_drift_misses(report)
    for r in report["rates"]:
        c, g = r["compare"], r["given_measured_compute"]
        checks = [("whole mean_batch", c["mean_batch"]["error"], 0.40),
                  ("diagnosis' times on the run's batches", g["run_batches"]["error"], 0.05)
                  ] + [(k, g["compare"][k]["error"], tol) for k, tol in (
                      ("compute_ms", 0.10), ("mean_batch", 0.10), ("p50_ms", 0.10))]
        misses += [f"{r['rate_per_s']:g}/s {k} {e:+.1%} (±{tol:.0%})"
                   for k, e, tol in checks if not abs(e) < tol]
        # p99 is printed, not judged: a tail of 5 s of a real Triton on two shared cores
        # moves by more than its ±20% between quiet runs (-23.9% in a quiet CI run of
        # 2026-12-01, +23.5% in an earlier one; issue 28 holds the p99 gap), so the
        # figure belongs to bench/ and docs/, not to a check that passes or fails.
        print(f"{r['rate_per_s']:g}/s p99 given the run's batch times: "
              f"{g['compare']['p99_ms']['error']:+.1%}")
    return misses


@pytest.mark.slow
def test_validate_against_a_real_triton(tmp_path):
    """Every run is checked for what validate read and fitted. The prediction is judged
    on runs where this virtual machine's hypervisor left its CPUs alone: session 7
    measured it taking up to 15% of their time (steal) through this test, and in such
    runs the profile read up to 65% slow and 20-60 ms stalls landed in p99 (5 of 6 runs
    missed somewhere), while session 6, quiet, held all twelve points. A run that misses
    is followed by another on a fresh server, up to three; the test fails if none holds
    and any of them was quiet. If none was quiet, it says so."""
    py = pytriton_python()
    if py is None:
        pytest.skip("no PyTriton venv (scripts/test.sh builds .venv-pytriton)")

    def run(attempt: int) -> dict:
        trace = tmp_path / f"trace{attempt}" / "t.json"  # Triton's own, read by validate
        trace.parent.mkdir()
        out = run_against_triton(py, lambda port: [
            "validate", "--url", f"http://127.0.0.1:{port}", "--model", "sleep", "--rates",
            "100,250,400", "--duration", "5", "--json", "--out", str(tmp_path / f"v{attempt}"),
            "--trace-file", str(trace)], str(trace))
        assert out.returncode == 0, out.stderr[-3000:]
        report = json.loads(out.stdout)
        check_report(report, tmp_path / f"v{attempt}")
        return report

    judged_on_quiet_runs(run, fidelity_misses)


def assert_only_tritons_malformed_heads(step: dict) -> None:
    """No request failed, but for the odd answer whose head Triton's HTTP server broke
    (a `Content-Length` line sent without its name: 1 in about 16,000 answers at 400/s
    with its trace on, reproduced 2026-12-06; loadgen.MALFORMED_HEAD), which the client
    counts as an error with that reason, as a strict client refuses it: at most one in
    a thousand."""
    reasons = step.get("errors_by_reason") or {}
    assert set(reasons) <= {MALFORMED_HEAD}, reasons
    assert step["errors"] <= step["requests"] / 1000, reasons


def check_report(report: dict, out: Path) -> None:
    assert report["policy_source"] == "the server's config"
    fitted = (out / "scenario.toml").read_text()
    assert "max_batch_size = 32" in fitted
    assert "max_queue_delay_microseconds = 2000" in fitted
    prof = report["profile"]
    rows = {int(k): v for k, v in prof["rows_ms"].items()}
    assert sorted(rows) == [1, 2, 4, 8, 16, 32]
    assert all(v > 2.0 for v in rows.values())  # every batch sleeps 2 ms
    # Triton's Python backend costs something per request beyond the rows
    assert prof["per_request_ms"] > 0.01
    figures = ("mean_batch", "p50_ms", "p99_ms", "queue_ms", "compute_ms")
    for r in report["rates"]:
        c = r["compare"]
        assert_only_tritons_malformed_heads(r["measured"])
        g = r["given_measured_compute"]
        print(r["rate_per_s"], "whole:", {k: c[k]["error"] for k in figures},
              "given the run's batch times:", {k: g["compare"][k]["error"] for k in figures},
              "sizes ms (batches):", {k: (round(v, 3), g["batches"][k])
                                      for k, v in g["sizes_ms"].items()},
              "trend ms:", g["trend_ms"], "times on the run's batches:", g["run_batches"],
              "on the sent times:", {k: v["error"] for k, v in g["on_sent_times"].items()})
        assert abs(c["throughput_per_s"]["error"]) < 0.05, c["throughput_per_s"]
        # Triton's own trace, read during the warm-up (--trace-file): the instance's
        # turnaround between batches (60-80 us after a batch of 1-2 on this server,
        # 2026-12-03) and its stalls; the prediction without the hand-off kept beside
        ho, w = r["warmup"]["handoff"], r["warmup"]
        assert ho is not None, report["notes"]
        assert ho["turnaround_gaps"] > 0
        assert 0 < ho["turnaround_ms"]["1"] < 2.0, ho
        assert ho["batcher_first"] is None or 0 <= ho["batcher_first"] <= 1
        assert w["stalls"] is not None
        assert set(w["split"]["measured"]) == set(w["split"]["simulated"])
        assert set(r["without_handoff"]) == set(c)
        assert w["series"] is not None
        assert w["series"]["batches"] > 0
        assert set(r["without_series"]) == set(c)


@pytest.mark.slow
def test_replaying_a_real_tritons_trace_tells_its_closing_rule(tmp_path):
    """Triton traces every request (queue entry, batch start and end) while open-loop
    load runs; the replay gives the engine those arrivals and execution times. Measured
    here: Triton's rule within 3-4% on mean batch and 6.5-14% long on mean queue at 300
    and 600/s (the rule removed in 0.2.0, "absorb until start", was 40-55% short)."""
    py = pytriton_python()
    if py is None:
        pytest.skip("no PyTriton venv (scripts/test.sh builds .venv-pytriton)")
    tried: list[tuple[float, float, list[str]]] = []
    for attempt in range(2):  # a fresh Triton each time; judged as the validate tests are
        use = HostUse()
        misses = replay_misses(py, tmp_path / f"a{attempt}")
        steal, others = use.shares()
        tried.append((steal, others, misses))
        print(f"run {attempt + 1}: steal {steal:.1%}, other processes {others:.1%}, "
              f"misses {misses}")
        if not misses:
            return
    quiet = [t for t in tried if t[0] <= QUIET_STEAL and t[1] <= QUIET_OTHERS]
    assert not quiet, f"runs with the CPUs quiet missed: {quiet}"
    skip_host_busy(f"every run was busy (steal, others, misses): {tried}")


def replay_misses(py: str, d: Path) -> list[str]:
    """One traced load on a fresh Triton, replayed: what replay-trace reads and writes is
    asserted; the fidelity figures that miss their tolerance are returned."""
    d.mkdir()
    trace = d / "t.json"

    def written() -> None:
        """Triton writes each 500 requests' traces as it goes, on its own time; a file
        not yet written when the server is stopped is lost (one run of session 10 had
        only the first when stopped at once), so wait for the second, up to 30 s."""
        deadline = time.monotonic() + 30
        while len(list(d.glob("t.json.*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)

    out = run_against_triton(py, lambda port: [
        "load", "--url", f"http://127.0.0.1:{port}", "--model", "sleep", "--qps", "300",
        "--duration", "5", "--json"], str(trace), before_stop=written)
    assert out.returncode == 0, out.stderr[-3000:]
    files = sorted(d.glob("t.json.*"))  # written every 500 requests
    assert len(files) >= 2, (list(d.iterdir()), out.stdout[-2000:])
    fitted_toml = d / "fitted.toml"
    rep = subprocess.run([sys.executable, "-m", "servelab", "replay-trace", *map(str, files),
                          "--max-batch-size", "32", "--max-queue-delay-us", "2000",
                          "--scenario-out", str(fitted_toml), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-3000:]
    r = json.loads(rep.stdout)
    assert r["model"] == "sleep"
    assert r["requests"] >= 1000
    assert 0.0 <= r["batcher_first"] <= 1.0, r["batcher_first"]
    # the fitted scenario runs as any other
    sim = subprocess.run([sys.executable, "-m", "servelab", "simulate", "--scenario",
                          str(fitted_toml), "--json"], capture_output=True, text=True,
                         timeout=300)
    assert sim.returncode == 0, sim.stderr[-2000:]
    sim_batch = json.loads(sim.stdout)["batching"]["mean_batch_size"]
    triton = r["rules"]["triton"]["error"]
    raced = r["rules"]["triton, measured race"]
    fitted = raced["error"]
    left = r["measured"]["left_behind_share"]
    checks = [
        # Triton starts batches while older requests it had room for wait for a later one
        ("measured left_behind_share > 0.1", left > 0.1),
        ("triton mean_batch within 10%", abs(triton["mean_batch"]) < 0.10),
        ("triton queue_mean_ms within 25%", abs(triton["queue_mean_ms"]) < 0.25),
        # With each batch's turnaround and the completion race read from the trace (the
        # recorded traces of tests/data hold it to issue 28's 5 points, 3% and 10%;
        # tests/unit/test_triton_traces_recorded.py), looser here on a live, shared run:
        ("measured race: left_behind_share within 8 points",
         abs(raced["left_behind_share"] - left) < 0.08),
        ("measured race: mean_batch within 5%", abs(fitted["mean_batch"]) < 0.05),
        ("measured race: queue_p50_ms within 15%", abs(fitted["queue_p50_ms"]) < 0.15),
        # Triton's batches vary (stalls of the shared machine): the measured spread is there
        ("spread cv > 0.02", r["spread"]["cv"] > 0.02),
        ("the fitted scenario's mean batch within 25%",
         sim_batch == pytest.approx(r["measured"]["mean_batch"], rel=0.25)),
    ]
    return [f"{name} ({triton}, {fitted})" if "triton" in name or "race" in name else name
            for name, ok in checks if not ok]


# JSON tensor data for an FP32 [-1, 16] input: Triton 2.51 and the gateway refuse the
# same bodies (Triton with a 500 "Unable to parse 'data'", the gateway with a 400: a
# client's mistake) and take the same ones, except where the gateway is stricter on
# purpose: NaN (not JSON; Triton's parser allows it) and a value past FP32's range
# (Triton casts 1e39 to inf and answers NaN outputs).
MALFORMED: dict[str, object] = {
    "string": ["0.5"] * 16, "boolean": [True] * 16, "null": [None] * 16,
    "object": [{"v": 1}] * 16, "too few": [0.5] * 15, "not a list": 0.5,
}
ACCEPTED: dict[str, object] = {
    "numbers": [0.5] * 16, "integers": [1] * 16, "nested": [[0.5] * 16],
    "mixed nesting": [0.5, [0.5] * 15],
}
STRICTER = {"1e39": [1e39] * 16}
NAN_BODY = (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [NaN'
            + b", 1" * 15 + b"]}]}")


def _body(data: object) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                                   "data": data}]}).encode()


@pytest.mark.slow
def test_tensor_data_is_refused_and_taken_as_a_real_triton_does(tmp_path):
    import warnings

    import httpx

    from servelab.gateway.app import Metrics, ServedModel, create_gateway
    from servelab.gateway.demo import write_mlp
    from servelab.gateway.runner import OnnxModel
    from servelab.scenario import BatchingPolicy

    py = pytriton_python()
    if py is None:
        pytest.skip("no PyTriton venv (scripts/test.sh builds .venv-pytriton)")
    cases = {**MALFORMED, **ACCEPTED, **STRICTER}
    triton: dict[str, int] = {}

    def ask_triton(port: int) -> None:
        url = f"http://127.0.0.1:{port}/v2/models/sleep/infer"
        for name, data in cases.items():
            triton[name] = httpx.post(url, content=_body(data), timeout=30).status_code
        triton["NaN"] = httpx.post(url, content=NAN_BODY, timeout=30).status_code

    ports: list[int] = []

    def quick_command(port: int) -> list[str]:  # the bodies go in while Triton runs
        ports.append(port)
        return ["kv", "--json"]

    done = run_against_triton(py, quick_command, before_stop=lambda: ask_triton(ports[-1]))
    assert done.returncode == 0, done.stderr
    metrics = Metrics()
    served = ServedModel(OnnxModel(write_mlp(tmp_path / "m.onnx"), "sleep"),
                         BatchingPolicy(max_batch_size=8), 1, metrics)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

        with TestClient(create_gateway([served], metrics=metrics),
                        base_url="http://127.0.0.1") as c:
            ours = {name: c.post("/v2/models/sleep/infer", content=_body(data)).status_code
                    for name, data in cases.items()}
            ours["NaN"] = c.post("/v2/models/sleep/infer", content=NAN_BODY).status_code
    print("Triton:", triton, "servelab:", ours)
    for name in MALFORMED:
        assert triton[name] >= 400, (name, triton[name])
        assert ours[name] == 400, (name, ours[name])
    for name in ACCEPTED:
        assert triton[name] == ours[name] == 200, (name, triton[name], ours[name])
    for name in (*STRICTER, "NaN"):  # stricter on purpose; a Triton that refuses too is fine
        assert ours[name] == 400, (name, ours[name])
