"""`servelab replay-trace`: a Triton trace read as Triton writes it, and replayed through
the batcher. The real-Triton test is tests/integration/test_validate_triton.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.batching.simulate import simulate_policy
from servelab.errors import InputError
from servelab.measure.replay import IN_ORDER, left_behind_share, replay
from servelab.scenario import BatchingPolicy
from servelab.trace_file import read_trace


def write_trace(path: Path, queue: np.ndarray, start: np.ndarray, end: np.ndarray,
                model: str = "m") -> Path:
    """As tritonserver writes a trace at level TIMESTAMPS: one event per timestamp (and
    one with the model's name), the events of many requests interleaved."""
    events: list[dict[str, object]] = []
    for i, (q, s, e) in enumerate(zip(queue, start, end, strict=True)):
        rid = i + 1
        events += [{"id": rid, "timestamps": [{"name": "HTTP_RECV_START", "ns": int(q) - 50}]},
                   {"id": rid, "model_name": model, "model_version": 1},
                   {"id": rid, "timestamps": [{"name": "REQUEST_START", "ns": int(q) - 10}]},
                   {"id": rid, "timestamps": [{"name": "QUEUE_START", "ns": int(q)}]},
                   {"id": rid, "timestamps": [{"name": "COMPUTE_START", "ns": int(s)}]},
                   {"id": rid, "timestamps": [{"name": "COMPUTE_END", "ns": int(e)}]}]
    rng = np.random.default_rng(0)
    order = rng.permutation(len(events))
    path.write_text(json.dumps([events[k] for k in order]))
    return path


POLICY = BatchingPolicy(max_batch_size=8, max_queue_delay_microseconds=2000)


def simulated_trace(tmp_path: Path, batcher_first: float = 0.0) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(1e9 / 900, 3000)).astype(np.int64) + 10**12
    table = np.zeros(9)
    table[1:] = (2.0 + 0.3 * np.arange(1, 9)) * 1e6  # 2.3 ms .. 4.4 ms per batch
    rec = simulate_policy(arrivals, table, np.ones(1), BatchingPolicy(
        **{**_fields(POLICY), "batcher_first": batcher_first}), 1, seed=7)
    return write_trace(tmp_path / "t.json", rec.arrival_ns, rec.start_ns, rec.end_ns), rec.start_ns


def _fields(p: BatchingPolicy) -> dict[str, object]:
    return {k: getattr(p, k) for k in p.__dataclass_fields__}


def test_a_trace_the_engine_made_replays_exactly_under_its_rule(tmp_path):
    path, _ = simulated_trace(tmp_path)
    report = replay(read_trace([path]), POLICY, 1)
    assert report["requests"] == 3000
    assert report["skipped"] == 0
    assert report["batcher_first"] == 0.0  # the instance won every race
    assert report["races_judged"] > 100
    # the engine's next batch starts at the very end of the last: no turnaround
    assert set(report["turnaround_ms_by_size"].values()) == {0.0}
    for rule in ("triton", "triton, measured race"):
        own = report["rules"][rule]
        for key, value in report["measured"].items():
            assert own[key] == pytest.approx(value, rel=1e-12, abs=1e-12), (rule, key)
    # Triton's rule starts a batch while an older request waits for a later one
    assert report["rules"]["triton"]["left_behind_share"] > 0.2
    assert report["exec_ms_by_size"][1] == pytest.approx(2.3)


def test_the_spread_in_its_order_replays_a_slow_stretch_that_resampling_loses(tmp_path):
    """A server that runs slow for a stretch (batches 400-520 at 2.2x, as a shared CPU
    does): its queue's tail comes from that stretch. Taken in the trace's order the
    measured spread replays it exactly; resampled, the slow batches scatter over the run
    and the tail comes out short."""
    rng = np.random.default_rng(4)
    arrivals = np.cumsum(rng.exponential(1e9 / 700, 3000)).astype(np.int64) + 10**12
    table = np.zeros(9)
    table[1:] = (2.0 + 0.3 * np.arange(1, 9)) * 1e6
    mult = np.ones(3000)
    mult[400:520] = 2.2
    rec = simulate_policy(arrivals, table, mult, POLICY, 1)
    path = write_trace(tmp_path / "t.json", rec.arrival_ns, rec.start_ns, rec.end_ns)
    report = replay(read_trace([path]), POLICY, 1)
    measured, rules = report["measured"], report["rules"]
    assert report["batcher_first"] == 0.0  # no race drawn: the replay can be exact
    in_order = rules[IN_ORDER]
    for key in ("mean_batch", "queue_mean_ms", "queue_p50_ms", "queue_p90_ms",
                "queue_p99_ms"):
        assert in_order[key] == pytest.approx(measured[key], rel=1e-6), key
    assert rules["triton, measured race, measured spread"]["error"]["queue_p99_ms"] < -0.2


@pytest.mark.parametrize("share", [0.2, 0.4, 1.0])
def test_the_share_of_races_the_batcher_won_is_read_from_the_trace(tmp_path, share):
    """Read from the trace's events (did a request queued after the payload closed join
    it?), not fitted: the share the engine drew comes back, and with it the figures
    nobody fitted (queue, and batches that left an older request behind)."""
    path, _ = simulated_trace(tmp_path, batcher_first=share)
    report = replay(read_trace([path]), POLICY, 1)
    assert report["batcher_first"] == pytest.approx(share, abs=0.08)
    raced, source = report["rules"]["triton, measured race"], report["rules"]["triton"]
    assert abs(raced["error"]["queue_mean_ms"]) < 0.05
    left = report["measured"]["left_behind_share"]
    assert abs(raced["left_behind_share"] - left) < 0.05  # in points
    assert abs(source["left_behind_share"] - left) > 0.1


def test_the_instances_turnaround_is_read_between_batches(tmp_path):
    """A batch's instance is busy past its COMPUTE_END (answers, releases, the next
    payload's hand-off): the gap to the next batch's start when that batch was already
    waiting, per size of the batch that ended; idle gaps are not turnaround."""
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(1e9 / 900, 3000)).astype(np.int64)
    table = np.zeros(9)
    table[1:] = (2.0 + 0.3 * np.arange(1, 9)) * 1e6
    turn = np.zeros(9)
    turn[1:] = (0.05 + 0.01 * np.arange(1, 9)) * 1e6  # 60 us after 1 row .. 130 after 8
    rec = simulate_policy(arrivals, table + turn, np.ones(1), POLICY, 1, seed=7)
    # the engine's batch held its instance for compute + turnaround: as a trace shows it,
    # the compute ends `turnaround` before the instance takes the next payload
    _, inv, counts = np.unique(rec.start_ns, return_inverse=True, return_counts=True)
    sizes = counts[inv]
    end = rec.end_ns - turn[sizes].astype(np.int64)
    report = replay(read_trace([write_trace(tmp_path / "t.json", rec.arrival_ns,
                                            rec.start_ns, end)]), POLICY, 1)
    for size, ms in report["turnaround_ms_by_size"].items():
        assert ms == pytest.approx(turn[size] / 1e6, abs=1e-6), size
    for size, ms in report["exec_ms_by_size"].items():
        assert ms == pytest.approx(table[size] / 1e6, abs=1e-6), size
    own = report["rules"]["triton"]
    for key, value in report["measured"].items():
        assert own[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key


def test_the_trace_becomes_a_scenario_the_other_commands_take(tmp_path):
    from typer.testing import CliRunner

    from servelab.cli import app
    from servelab.scenario import Variability, load_scenario

    path, _ = simulated_trace(tmp_path, batcher_first=0.4)
    out = tmp_path / "fitted.toml"
    res = CliRunner().invoke(app, ["replay-trace", str(path), "--max-batch-size", "8",
                                   "--max-queue-delay-us", "2000", "--scenario-out", str(out),
                                   "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    s = load_scenario(out)
    assert s.batching.batcher_first == report["batcher_first"]
    assert s.batching.max_batch_size == 8
    assert dict(s.model.points)[1] == pytest.approx(2.3)
    # the engine's batches took exactly their size's time: no spread to resample
    assert s.model.variability is Variability.EMPIRICAL
    assert set(s.model.multipliers) == {1.0}
    assert report["spread"]["cv"] == pytest.approx(0.0, abs=1e-12)
    assert s.workload.qps == pytest.approx(report["offered_per_s"], rel=1e-3)
    # with no spread, the row that resamples it is the measured-race row
    rules = report["rules"]
    assert rules["triton, measured race, measured spread"]["queue_mean_ms"] == pytest.approx(
        rules["triton, measured race"]["queue_mean_ms"])
    sim = CliRunner().invoke(app, ["simulate", "--scenario", str(out), "--json"])
    assert sim.exit_code == 0, sim.output
    # Poisson at the trace's rate, through the measured race: the trace's batching, roughly
    assert json.loads(sim.stdout)["batching"]["mean_batch_size"] == pytest.approx(
        report["measured"]["mean_batch"], rel=0.15)


def test_left_behind_counts_batches_that_started_past_an_older_waiting_request():
    # a arrives at 0 and b at 1; batch {a} starts at 5 while b waits, b starts at 10;
    # c arrives at 20 and starts alone at 22 (nobody older waiting)
    arrival = np.array([0, 1, 20], np.int64)
    start = np.array([5, 10, 22], np.int64)
    assert left_behind_share(arrival, start, 8) == pytest.approx(1 / 3)
    # a full batch leaves others behind by necessity: not counted
    assert left_behind_share(arrival, start, 1) == 0.0


def test_numbered_files_are_read_together_and_incomplete_requests_are_counted(tmp_path):
    q = np.array([0, 10, 20, 30], np.int64) * 10**6
    s, e = q + 2 * 10**6, q + 5 * 10**6
    a = write_trace(tmp_path / "t.json.0", q[:2], s[:2], e[:2])
    b = write_trace(tmp_path / "t.json.1", q[2:], s[2:], e[2:])
    events = json.loads(b.read_text())
    for ev in events:  # the files number their requests from 1 each: make them distinct
        ev["id"] += 100
    events.append({"id": 999, "model_name": "m"})  # rejected: never queued nor computed
    b.write_text(json.dumps(events))
    tr = read_trace([a, b])
    assert tr.queue_ns.tolist() == q.tolist()
    assert tr.skipped == 1


@pytest.mark.parametrize(("doc", "says"), [
    ({"a": 1}, "not a Triton trace"),
    ([1, 2], "is not an object"),
    ([{"id": 1, "timestamps": 5}], "is not a list"),
    ([{"id": 1, "timestamps": [{"name": "QUEUE_START", "ns": -5}]}], "an integer from 0"),
    ([{"id": 1, "timestamps": [{"name": "QUEUE_START", "ns": "5"}]}], "an integer from 0"),
    ([{"id": 1, "model_name": "m"}], "no request of 'm' has QUEUE_START"),
    ([{"id": 1, "model_name": "a"}, {"id": 2, "model_name": "b"}], "choose one with --model"),
    ([{"id": 1, "model_name": "m", "timestamps": [
        {"name": "QUEUE_START", "ns": 10}, {"name": "COMPUTE_START", "ns": 5},
        {"name": "COMPUTE_END", "ns": 20}]}], "out of order"),
])
def test_a_bad_trace_is_one_line_naming_what_is_wrong(tmp_path, doc, says):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=says) as info:
        read_trace([path])
    assert "\n" not in str(info.value)


def test_a_model_not_in_the_trace_or_a_batch_past_max_batch_size_is_refused(tmp_path):
    q = np.arange(4, dtype=np.int64) * 10**6
    path = write_trace(tmp_path / "t.json", q, np.full(4, 5 * 10**6), np.full(4, 9 * 10**6))
    with pytest.raises(InputError, match="--model = x: not in the trace"):
        read_trace([path], "x")
    with pytest.raises(InputError, match="a batch of 4 requests"):
        replay(read_trace([path]), BatchingPolicy(max_batch_size=2), 1)


events = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2**63) | st.text(max_size=12)
    | st.sampled_from(["QUEUE_START", "COMPUTE_START", "COMPUTE_END", "m"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["id", "timestamps", "name", "ns", "model_name"]), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(doc=st.lists(events, max_size=6))
def test_any_json_is_a_trace_or_one_line_error(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("t") / "t.json"
    path.write_text(json.dumps(doc))
    message = ""
    try:
        replay(read_trace([path]), BatchingPolicy(max_batch_size=32), 1)
    except InputError as exc:
        message = str(exc)
    assert "\n" not in message
