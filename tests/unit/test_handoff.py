"""The hand-off between batches read from a trace (measure/handoff.py), and what validate
does with it: each size's turnaround on top of its batch time, and the completion race as
the scenario's batcher_first."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.batching.simulate import simulate_policy
from servelab.errors import InputError
from servelab.measure.handoff import (
    MIN_RACES,
    MIN_SIZE_GAPS,
    HandOff,
    handoff_note,
    read_handoff,
)
from servelab.scenario import BatchingPolicy
from servelab.trace_file import TraceRequests

MBS = 8
DELAY_NS = 2_000_000
POLICY = BatchingPolicy(max_batch_size=MBS, max_queue_delay_microseconds=2000)
COMPUTE_NS = np.array([0] + [(2.0 + 0.3 * k) * 1e6 for k in range(1, MBS + 1)])
TURN_NS = np.array([0] + [(0.05 + 0.04 * k) * 1e6 for k in range(1, MBS + 1)])


def engine_trace(rate: float, n: int, turn_ns: np.ndarray = TURN_NS,
                 batcher_first: float = 0.0, seed: int = 1) -> TraceRequests:
    """A trace as a server with these compute times and turnarounds writes it: the engine
    holds each batch's instance for compute + turnaround, and the trace's COMPUTE_END is
    the compute's end (the turnaround comes after it, before the next COMPUTE_START)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1e9 / rate, n)).astype(np.int64)
    rec = simulate_policy(arrivals, COMPUTE_NS + turn_ns, np.ones(1),
                          replace(POLICY, batcher_first=batcher_first), 1, seed=7)
    size = rec.batch_size[rec.batch]  # (every request is served here)
    end = rec.start_ns + COMPUTE_NS[size].astype(np.int64)
    return TraceRequests("m", rec.arrival_ns, rec.start_ns, end, 0)


def test_the_turnaround_after_each_size_is_read_from_the_gaps_behind_a_waiting_payload():
    """Under load the next payload waits when a batch ends, so the instance's gap from the
    end to the next start is its turnaround, exactly; sizes seen too rarely take the
    count-weighted line through the others (here the turnaround is itself a line)."""
    tr = engine_trace(1500, 4000)
    h = read_handoff(tr, MBS, DELAY_NS)
    assert h is not None
    assert h.gaps > 500
    assert len(h.sizes_read) >= 3
    for k in h.sizes_read:
        assert h.at(k) == pytest.approx(TURN_NS[k] / 1e6, abs=1e-6)
    for k in range(1, MBS + 1):  # read or on the line
        assert h.at(k) == pytest.approx(TURN_NS[k] / 1e6, abs=1e-6)
    assert h.at(0) == h.at(1)
    assert h.at(99) == h.at(MBS)


def test_a_stall_between_two_batches_is_not_a_turnaround():
    """A gap far over its size's usual one is the whole server stopped (simulated apart,
    as a stall), not the instance's turnaround: left out of the mean."""
    tr = engine_trace(1500, 4000)
    plain = read_handoff(tr, MBS, DELAY_NS)
    assert plain is not None
    starts = np.unique(tr.start_ns)
    # the server stops 20 ms before the 500th batch, with its payload waiting: that
    # batch and every later one run 20 ms later than they did
    late = tr.start_ns >= starts[500]
    shift = np.where(late, 20_000_000, 0)
    stalled = TraceRequests("m", tr.queue_ns, tr.start_ns + shift, tr.end_ns + shift, 0)
    assert (stalled.start_ns >= stalled.queue_ns).all()
    h = read_handoff(stalled, MBS, DELAY_NS)
    assert h is not None
    assert h.gaps == plain.gaps - 1  # the stall's gap, left out
    # one 20 ms gap among a few hundred would move its size's mean by tens of us
    for k in plain.sizes_read:
        assert h.at(k) == pytest.approx(TURN_NS[k] / 1e6, abs=1e-6)


def test_an_idle_instances_wait_is_not_a_turnaround():
    """At low load the next request mostly comes after a batch ends: the instance's idle
    wait is no turnaround, and the few gaps behind a waiting payload (a Poisson clump)
    are too few to read, so the prediction adds nothing."""
    tr = engine_trace(20, 300)
    h = read_handoff(tr, MBS, DELAY_NS)
    assert h is not None
    assert h.gaps < MIN_SIZE_GAPS
    assert h.sizes_read == ()
    assert set(h.turnaround_ms) == {0.0}
    assert h.race is None  # too few completions with a payload waiting to judge


@pytest.mark.parametrize("share", [0.0, 0.3, 0.8])
def test_the_completion_race_is_the_share_the_server_drew(share):
    """(At 900/s: where batches fill to max_batch_size at most completions, fewer races
    have room to be judged and the share reads low, turnaround or not: 0.25 for 0.3 at
    1,500/s here.)"""
    tr = engine_trace(900, 4000, batcher_first=share)
    h = read_handoff(tr, MBS, DELAY_NS)
    assert h is not None
    assert h.race is not None
    assert h.races_judged >= MIN_RACES
    assert h.race == pytest.approx(share, abs=0.08)
    assert read_handoff(tr, MBS, DELAY_NS, race=False).race is None  # type: ignore[union-attr]


def test_with_more_instances_no_turnaround_is_read():
    """A trace does not say which batch followed which on an instance."""
    tr = engine_trace(1500, 2000)
    h = read_handoff(tr, MBS, DELAY_NS, instances=2)
    assert h is not None
    assert set(h.turnaround_ms) == {0.0}
    assert h.gaps == 0


def test_a_batch_over_max_batch_size_or_no_request_reads_nothing():
    tr = engine_trace(1500, 2000)
    assert read_handoff(tr, 2, DELAY_NS) is None
    empty = np.zeros(0, dtype=np.int64)
    assert read_handoff(TraceRequests("m", empty, empty, empty, 0), MBS, DELAY_NS) is None


def test_the_note_says_what_was_read_and_nothing_when_nothing_was():
    h = read_handoff(engine_trace(900, 4000, batcher_first=0.3), MBS, DELAY_NS)
    assert h is not None
    assert h.race is not None
    note = handoff_note(h, "at 900/s")
    assert len(note) == 1
    k = h.sizes_read[0]
    assert f"a turnaround of {TURN_NS[k] / 1e6:.3f} ms after {k}," in note[0]
    assert f"winning {h.race:.0%} of {h.races_judged} completion races" in note[0]
    assert "completion races" in note[0]
    assert "without_handoff" in note[0]
    assert handoff_note(None, "at 1/s") == []
    assert handoff_note(HandOff((0.0,) * 3, 0, (), None, 0), "at 1/s") == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 3_000_000),
                          st.integers(1, 5_000_000), st.integers(0, 4_000_000)),
                min_size=1, max_size=60),
       st.integers(1, 3))
def test_any_trace_gives_a_bounded_hand_off_or_none(batches, instances):
    """Any batches (size, queue spread before the start, compute, gap to the next):
    never an error, every turnaround finite and at least 0, the share in 0..1."""
    queue, start, end = [], [], []
    t = 0
    for size, spread, compute, gap in batches:
        for j in range(size):
            queue.append(t - spread * j // max(size, 1))
            start.append(t)
            end.append(t + compute)
        t += compute + gap + 1
    order = np.argsort(queue, kind="stable")
    tr = TraceRequests("m", *(np.asarray(a, dtype=np.int64)[order] for a in (queue, start,
                                                                             end)), 0)
    h = read_handoff(tr, 4, DELAY_NS, instances)
    if max(b[0] for b in batches) > 4:
        assert h is None
        return
    assert h is not None
    assert len(h.turnaround_ms) == 5
    assert all(np.isfinite(x) and x >= 0 for x in h.turnaround_ms)
    assert h.race is None or 0.0 <= h.race <= 1.0
    assert h.to_dict()["turnaround_gaps"] == h.gaps


# --- validate: what the prediction does with it, and the flags -------------------------

def test_the_scenario_adds_each_sizes_turnaround_and_takes_the_race():
    from servelab.measure.load import Target
    from servelab.measure.validate import Profile, ServerPolicy, fit_scenario

    t = Target("127.0.0.1", 1, "m")
    sp = ServerPolicy(replace(POLICY, batcher_first=0.25), 1, "flags")
    prof = Profile(rows_ms={1: 1.5, 2: 2.0, 4: 3.0, 8: 5.0}, outside_ms=np.full(50, 0.5))
    plain = fit_scenario(t, sp, prof)
    assert plain.batching.batcher_first == 0.25
    turn = tuple([0.0] + [0.1 * k for k in range(1, MBS + 1)])
    handed = fit_scenario(t, sp, replace(prof, handoff=HandOff(turn, 100, (1, 2), 0.4, 90)))
    before = {int(b): ms for b, ms in plain.model.points}
    after = {int(b): ms for b, ms in handed.model.points}
    assert set(before) == set(after) == {1, 2, 4, 8}
    for b in before:
        assert after[b] == pytest.approx(before[b] + 0.1 * b)
    assert handed.batching.batcher_first == 0.4
    # a race not read (too few judged, or --batcher-first given): the policy's
    kept = fit_scenario(t, sp, replace(prof, handoff=HandOff(turn, 100, (1,), None, 3)))
    assert kept.batching.batcher_first == 0.25


def test_trace_files_are_the_numbered_files_of_that_path_only(tmp_path: Path):
    from servelab.measure.validate import trace_files

    for name in ("t[1].json.0", "t[1].json.10", "t[1].json.2", "t[1].json.3.tmp",
                 "t1.json.4", "t[1].json.x", "t[1].jsonx.5"):
        (tmp_path / name).write_text("[]")
    got = trace_files(tmp_path / "t[1].json")
    assert [p.name for p in got] == ["t[1].json.0", "t[1].json.2", "t[1].json.10"]
    assert trace_files(tmp_path / "missing" / "t.json") == []


def test_the_trace_flags_are_checked_by_name(tmp_path: Path):
    from servelab.measure.validate import ValidationSpec

    with pytest.raises(InputError, match=r"--trace-file.*--url"):
        ValidationSpec(serve="demo", trace_file=tmp_path / "t.json")
    with pytest.raises(InputError, match=r"--trace-file.*folder that exists"):
        ValidationSpec(url="http://127.0.0.1:1", model="m",
                       trace_file=tmp_path / "nope" / "t.json")
    for no_warm_up in ({"calibrate": True}, {"calibrate_at_rate": False}):
        with pytest.raises(InputError, match=r"--trace-file.*warm-up at each rate"):
            ValidationSpec(url="http://127.0.0.1:1", model="m",
                           trace_file=tmp_path / "t.json", **no_warm_up)
    for flag in ("stalls", "handoff", "series"):
        with pytest.raises(InputError, match=f"--{flag}.*--trace-file"):
            ValidationSpec(url="http://127.0.0.1:1", model="m", **{flag: True})
        with pytest.raises(InputError, match=f"--{flag}"):  # no warm-up, no window
            ValidationSpec(serve="demo", calibrate=True, **{flag: True})
    url = ValidationSpec(url="http://127.0.0.1:1", model="m")
    assert not url.has_trace
    assert not url.with_handoff
    assert not url.with_stalls
    traced = ValidationSpec(url="http://127.0.0.1:1", model="m",
                            trace_file=tmp_path / "t.json")
    assert traced.has_trace
    assert traced.with_handoff
    assert traced.with_stalls
    assert not ValidationSpec(url="http://127.0.0.1:1", model="m", handoff=False,
                              trace_file=tmp_path / "t.json").with_handoff
    assert ValidationSpec(serve="demo").with_handoff
    assert not ValidationSpec(serve="demo", calibrate_at_rate=False).has_trace
    assert traced.with_series
    assert ValidationSpec(serve="demo").with_series
    assert not url.with_series
    assert not ValidationSpec(serve="demo", series=False).with_series


def test_the_scenario_draws_the_series_in_runs():
    from servelab.measure.load import Target
    from servelab.measure.stall_fit import SERIES_BLOCK
    from servelab.measure.validate import Profile, ServerPolicy, fit_scenario

    t = Target("127.0.0.1", 1, "m")
    sp = ServerPolicy(POLICY, 1, "flags")
    prof = Profile(rows_ms={1: 1.5, 2: 2.0}, outside_ms=np.full(50, 0.5))
    assert fit_scenario(t, sp, prof).model.variability.value == "deterministic"
    drawn = fit_scenario(t, sp, replace(prof, series=np.array([0.9, 1.1, 1.3, 0.7])))
    assert drawn.model.variability.value == "empirical"
    assert drawn.model.multipliers == (0.9, 1.1, 1.3, 0.7)
    assert drawn.model.multiplier_block == SERIES_BLOCK


def test_a_trace_file_that_held_no_warm_up_is_named_with_the_fix(tmp_path: Path):
    from servelab.measure.validate import LoadStep, RateCheck, trace_notes

    warm = LoadStep.__new__(LoadStep)
    row = RateCheck.__new__(RateCheck)
    for k, v in (("rate_per_s", 250.0), ("warmup_measured", warm), ("handoff", None),
                 ("stalls", None)):
        object.__setattr__(row, k, v)
    notes = trace_notes([row], tmp_path / "t.json", given=True)
    assert len(notes) == 1
    assert "--trace-file" in notes[0]
    assert "250/s" in notes[0]
    assert "level=TIMESTAMPS" in notes[0]
    assert trace_notes([row], tmp_path / "t.json", given=False) == []  # validate's own
    assert trace_notes([row], None, given=True) == []
