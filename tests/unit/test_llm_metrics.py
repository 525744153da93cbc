"""The LLM load run's figures: each equals an independent computation from the raw event
times (plain Python, vLLM's definitions as written in its benchmark), and hand cases."""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from servelab.errors import InputError
from servelab.measure.llm_metrics import (
    RunRecords,
    compute,
    parse_goodput,
    parse_percentiles,
)

MS = 1_000_000


def records(rows: list[dict[str, object]]) -> RunRecords:
    """rows: intended, sent, done (ns), chunks (list of ns), prompt, output, cached, error."""
    return RunRecords(
        intended_ns=np.array([r["intended"] for r in rows], np.int64),
        sent_ns=np.array([r.get("sent", r["intended"]) for r in rows], np.int64),
        done_ns=np.array([r["done"] for r in rows], np.int64),
        chunk_ns=tuple(np.array(r["chunks"], np.int64) for r in rows),
        prompt_tokens=np.array([r.get("prompt", 10) for r in rows], np.int64),
        output_tokens=np.array([r.get("output", len(r["chunks"])) for r in rows], np.int64),  # type: ignore[arg-type]
        cached_tokens=np.array([r.get("cached", -1) for r in rows], np.int64),
        errors=tuple(str(r.get("error", "")) for r in rows))


def test_one_request_by_hand() -> None:
    # sent at 0, first token at 30 ms, then 10 and 20 ms gaps, done at 52 ms; 3 tokens
    m = compute(records([{"intended": 0, "done": 52 * MS, "chunks": [30 * MS, 40 * MS, 60 * MS
                                                                          - 8 * MS]}]))
    assert m.ttft.mean == pytest.approx(30.0)
    assert m.e2el.mean == pytest.approx(52.0)
    assert m.tpot.mean == pytest.approx((52 - 30) / 2)  # (E2EL - TTFT) / (3 - 1)
    assert m.itl.median == pytest.approx(11.0)  # gaps 10 and 12 ms
    assert m.completed == 1
    assert m.failed == 0
    assert m.duration_s == pytest.approx(0.052)
    assert m.total_output_tokens == 3
    assert m.request_throughput == pytest.approx(1 / 0.052)


def test_latency_counts_from_the_intended_time_not_the_send() -> None:
    m = compute(records([{"intended": 0, "sent": 40 * MS, "done": 100 * MS,
                          "chunks": [50 * MS, 60 * MS]}]))
    assert m.ttft.mean == pytest.approx(50.0)
    assert m.send_late_p50_ms == pytest.approx(40.0)


def test_tokens_come_from_usage_not_chunks() -> None:
    # 2 chunks but the server counted 5 tokens (several tokens in a chunk)
    m = compute(records([{"intended": 0, "done": 90 * MS, "chunks": [10 * MS, 90 * MS],
                          "output": 5}]))
    assert m.total_output_tokens == 5
    assert m.tpot.mean == pytest.approx(80 / 4)


def test_goodput_counts_requests_meeting_every_slo() -> None:
    rows = [{"intended": 0, "done": 100 * MS, "chunks": [20 * MS, 60 * MS, 100 * MS]},
            {"intended": 0, "done": 100 * MS, "chunks": [80 * MS, 90 * MS, 100 * MS]},
            {"intended": 0, "done": 100 * MS, "chunks": [5 * MS], "output": 1}]
    m = compute(records(rows), goodput_ms={"ttft": 50, "tpot": 30})
    # first: ttft 20 ok, tpot 40 > 30 -> bad; second: ttft 80 bad; third: ttft 5, tpot 0 ok
    assert m.request_goodput == pytest.approx(1 / 0.1)
    assert compute(records(rows)).request_goodput is None


def test_failed_requests_are_counted_with_their_reason_and_left_out_of_latency() -> None:
    rows = [{"intended": 0, "done": 10 * MS, "chunks": [5 * MS, 10 * MS]},
            {"intended": 0, "done": 2 * MS, "chunks": [], "error": "http 503: busy",
             "output": -1, "prompt": -1},
            {"intended": 0, "done": 3 * MS, "chunks": [], "error": "http 503: busy",
             "output": -1, "prompt": -1}]
    m = compute(records(rows))
    assert (m.completed, m.failed) == (1, 2)
    assert m.errors_by_reason == {"http 503: busy": 2}
    assert m.e2el.mean == pytest.approx(10.0)
    assert m.total_input_tokens == 10


def test_cached_tokens_only_when_the_server_says() -> None:
    rows = [{"intended": 0, "done": 10 * MS, "chunks": [5 * MS], "cached": 7}]
    assert compute(records(rows)).cached_prompt_tokens == 7
    rows[0]["cached"] = -1
    assert compute(records(rows)).cached_prompt_tokens is None


def test_vllm_keys() -> None:
    d = compute(records([{"intended": 0, "done": 10 * MS, "chunks": [5 * MS, 10 * MS]}]),
                percentiles=(90.0, 99.0, 99.9)).to_dict()
    for key in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "request_goodput", "output_throughput",
                "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
                "p99_ttft_ms", "p90_tpot_ms", "p99.9_itl_ms", "mean_e2el_ms",
                "max_output_tokens_per_s", "max_concurrent_requests"):
        assert key in d, key


# ------------------------------------------------------------ the independent computation


def _pct(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (NumPy's default), written out."""
    v = sorted(values)
    if len(v) == 1:
        return v[0]
    pos = (len(v) - 1) * p / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _independent(rows: list[dict[str, object]], slo: dict[str, float]) -> dict[str, float]:
    ok = [r for r in rows if not r.get("error")]
    dur = max(int(r["done"]) for r in rows) / 1e9  # type: ignore[call-overload]
    ttfts, tpots, all_tpots, itls, e2els = [], [], [], [], []
    good = 0
    for r in ok:
        ch: list[int] = r["chunks"]  # type: ignore[assignment]
        e2e = (int(r["done"]) - int(r["intended"])) / 1e6  # type: ignore[call-overload]
        ttft = (ch[0] - int(r["intended"])) / 1e6 if ch else e2e  # type: ignore[call-overload]
        if ch:
            ttfts.append(ttft)
        out = int(r.get("output", len(ch)))  # type: ignore[call-overload]
        tpot = (e2e - ttft) / (out - 1) if out > 1 else 0.0
        if out > 1:
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls += [(b - a) / 1e6 for a, b in itertools.pairwise(ch)]
        e2els.append(e2e)
        vals = {"ttft": ttft, "tpot": tpot, "e2el": e2e}
        good += all(vals[k] <= v for k, v in slo.items())
    out_tok = sum(int(r.get("output", len(r["chunks"]))) for r in ok)  # type: ignore[call-overload, arg-type]
    res = {"completed": len(ok), "request_throughput": len(ok) / dur,
           "output_throughput": out_tok / dur, "request_goodput": good / dur}
    for name, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        vals = vals or [0.0]
        res[f"mean_{name}_ms"] = statistics.fmean(vals)
        res[f"median_{name}_ms"] = statistics.median(vals)
        res[f"std_{name}_ms"] = statistics.pstdev(vals)
        res[f"p90_{name}_ms"] = _pct(vals, 90)
        res[f"p99_{name}_ms"] = _pct(vals, 99)
    return res


@st.composite
def runs(draw: st.DrawFn) -> list[dict[str, object]]:
    rows = []
    for _ in range(draw(st.integers(1, 12))):
        intended = draw(st.integers(0, 2_000 * MS))
        late = draw(st.integers(0, 5 * MS))
        gaps = draw(st.lists(st.integers(1, 80 * MS), min_size=0, max_size=12))
        start = intended + late + draw(st.integers(1, 300 * MS))
        chunks = [start + sum(gaps[:k]) for k in range(len(gaps) + 1)] if gaps or draw(
            st.booleans()) else []
        done = (chunks[-1] if chunks else intended + late) + draw(st.integers(1, 5 * MS))
        row: dict[str, object] = {"intended": intended, "sent": intended + late,
                                  "done": done, "chunks": chunks,
                                  "output": len(chunks) * draw(st.integers(1, 3))}
        if draw(st.integers(0, 5)) == 0:
            row.update(error="timeout after 1 s", chunks=[], output=-1, prompt=-1)
        rows.append(row)
    return rows


@settings(max_examples=150, deadline=None)
@given(rows=runs(), ttft_slo=st.floats(1, 500), tpot_slo=st.floats(1, 100))
def test_every_metric_equals_an_independent_computation(rows, ttft_slo, tpot_slo) -> None:  # type: ignore[no-untyped-def]
    slo = {"ttft": ttft_slo, "tpot": tpot_slo}
    got = compute(records(rows), percentiles=(90.0, 99.0), goodput_ms=slo).to_dict()
    want = _independent(rows, slo)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key


def test_busiest_second_as_vllm_buckets_it() -> None:
    s = 1_000_000_000
    rows = [{"intended": 0, "done": int(2.5 * s), "chunks": [int(0.1 * s), int(1.1 * s),
                                                             int(1.2 * s), int(1.3 * s)]},
            {"intended": int(1.05 * s), "done": int(1.9 * s), "chunks": [int(1.5 * s)]}]
    m = compute(records(rows))
    assert m.max_output_tokens_per_s == 4  # second 1 holds 3 + 1 chunks
    assert m.max_concurrent_requests == 2


@pytest.mark.parametrize("bad", ["ttft", "ttft:", "ttft:-1", "tpot:nan", "x:5", "ttft:1e99"])
def test_goodput_mistakes_name_the_flag(bad: str) -> None:
    with pytest.raises(InputError, match="--goodput"):
        parse_goodput([bad])


def test_goodput_and_percentiles_parse() -> None:
    assert parse_goodput(["ttft:500", "tpot:50 e2el:2000"]) == {"ttft": 500, "tpot": 50,
                                                               "e2el": 2000}
    assert parse_percentiles("50,90,99.9") == (50, 90, 99.9)
    for bad in ("", "0", "100", "abc", ",".join(["50"] * 30)):
        with pytest.raises(InputError, match="--metric-percentiles"):
            parse_percentiles(bad)


def test_the_servers_own_tpot_and_prompt_cache_note() -> None:
    """llama.cpp's timings.predicted_ms over output tokens less one is TPOT by the
    server's clock; a step whose prompts came from the server's cache is noted."""
    from dataclasses import replace

    from servelab.measure.llm_validate import cache_note, server_tpot_ms

    rows = [{"intended": 0, "done": 52 * MS, "chunks": [30 * MS, 40 * MS, 50 * MS],
             "prompt": 100, "cached": 1},
            {"intended": 0, "done": 40 * MS, "chunks": [40 * MS], "prompt": 100,
             "cached": 0},  # one token: no TPOT
            {"intended": 0, "done": 9 * MS, "chunks": [], "error": "http 503"}]
    rec = records(rows)
    assert server_tpot_ms(rec).size == 0  # the server did not say
    rec = replace(rec, server_decode_ms=np.array([19.0, 0.0, -1.0]))
    assert server_tpot_ms(rec).tolist() == [9.5]  # 19 ms over 3 - 1 tokens
    assert cache_note(rec) == ()  # 1 of 200 prompt tokens: an index word or two
    cached = replace(rec, cached_tokens=np.array([90, 0, -1]))
    [note] = cache_note(cached)
    assert "90 of 200 prompt tokens" in note
    assert "--seed" in note


def test_steps_are_read_from_the_streams_chunk_times() -> None:
    """Two streams decoding in lockstep, 10 ms a step, a third prompt joining one step
    (40 ms), then idle: the steps are read back with their kind, and idle is no step."""
    from servelab.llm.serving import ProfileStepModel
    from servelab.measure.llm_validate import step_notes, steps_seen

    t = [0, 10, 20, 30, 70, 80]  # step starts, ms; the 30-70 step holds a prefill
    a = [x * MS for x in t]
    b = [x * MS + 200_000 for x in t]  # the same steps, 0.2 ms later on the wire
    c = [70 * MS + 100_000, 80 * MS + 100_000]  # its first token at 70 ms
    late = [500 * MS, 510 * MS]  # after 420 ms idle: its first gap is a step, not idle
    rec = records([{"intended": 0, "done": 90 * MS, "chunks": a, "prompt": 8},
                   {"intended": 0, "done": 90 * MS, "chunks": b, "prompt": 8},
                   {"intended": 0, "done": 90 * MS, "chunks": c, "prompt": 30},
                   {"intended": 0, "done": 520 * MS, "chunks": late, "prompt": 5}])
    rows = steps_seen(rec)
    # (prefill tokens, decode seqs, KV read, passes, passes of 2+ tokens, ms); the first
    # step (prompts) has no gap; without the server's limits, one pass a step
    assert rows.tolist() == [[0, 2, 18, 1, 1, 10], [0, 2, 20, 1, 1, 10], [0, 2, 22, 1, 1, 10],
                             [30, 2, 24, 1, 1, 40], [0, 3, 57, 1, 1, 10], [0, 1, 6, 1, 0, 10]]
    # llama.cpp with 4 slots: the four requests, sent together, took slots 3, 2, 1, 0, so
    # the step where the third's prompt (slot 1) joined the decodes on 2 and 3 was two
    # ubatches, and the three decodes after it on 1, 2, 3 one
    from servelab.llm.rules import SchedulingRule
    from servelab.measure.llm_validate import ServerLimits, replay_slots

    limits = ServerLimits(SchedulingRule.LLAMA_CPP, 4, 1024, 2048, "test")
    assert replay_slots(rec, 4).tolist() == [3, 2, 1, 0]
    assert steps_seen(rec, limits)[:, 3:5].tolist() == [[1, 1], [1, 1], [1, 1], [2, 2],
                                                         [1, 1], [1, 0]]
    model = ProfileStepModel(base_ms=8.0, per_prefill_token_ms=1.0, per_decode_seq_ms=1.0,
                             per_kv_token_ms=0.0, rows=0, max_abs_error_pct=0.0, source="hand")
    steps = range(0, 300, 10)  # 30 steps of two sequences, 10 ms each
    many = records([{"intended": 0, "done": 1, "chunks": [x * MS for x in steps],
                     "prompt": 8},
                    {"intended": 0, "done": 1, "chunks": [x * MS + 100 for x in steps],
                     "prompt": 8}])
    [note] = step_notes(steps_seen(many), model)
    assert "2 seq 10.0 ms vs 10.0 (+0%, 29 steps)" in note
    assert "a prompt joining" not in note  # none here
    # five steps where a 30-token prompt joined two decodes, each two passes: the model
    # says 2 x 8 + 30 + 2 = 48 ms where they took 60
    joined = np.array([[30, 2, 24, 2, 2, 60.0]] * 5)
    [note] = step_notes(joined, model)
    assert "a prompt joining decodes 60.0 ms vs 48.0 (-20%, 5 steps)" in note
    # a server that bunches tokens into chunks (vLLM when behind) shows no steps
    bunched = records([{"intended": 0, "done": 1, "chunks": [0, 10 * MS], "output": 5}])
    assert steps_seen(bunched).shape == (0, 6)
    assert step_notes(steps_seen(bunched), model) == ()


def test_steps_shorter_than_the_grouping_window_are_told_apart() -> None:
    """A 2-layer server's 1.2 ms steps are shorter than STEP_GROUP_NS (1.5 ms): a step
    makes one token a request, so a request's next chunk starts the next step. Two
    streams in lockstep (the second 0.1 ms behind on the wire) read as 2-sequence steps
    of 1.2 ms, a lone stream as 1-sequence steps; a chunk the client read 1 ms late
    takes out the step it lengthened and the one it shortened; and the slot replay
    releases each stream in the step of its last token."""
    from servelab.llm.rules import SchedulingRule
    from servelab.measure.llm_validate import (
        STEP_GROUP_NS,
        ServerLimits,
        lone_steps,
        replay_slots,
        step_groups,
        steps_seen,
    )

    step = 1_200_000
    assert step < STEP_GROUP_NS
    a = [k * step for k in range(20)]
    b = [t + 100_000 for t in a[:10]]  # decodes beside a for ten steps, then ends
    rec = records([{"intended": 0, "done": a[-1] + MS, "chunks": a, "prompt": 8},
                   {"intended": 0, "done": b[-1] + MS, "chunks": b, "prompt": 8}])
    groups = step_groups(rec, np.arange(2))
    assert [len(g) for g in groups] == [2] * 10 + [1] * 10
    rows = steps_seen(rec)
    assert rows[:, 1].tolist() == [2] * 9 + [1] * 10  # sequences decoding
    assert rows[:, 5] == pytest.approx([1.2] * 9 + [1.2] * 10)
    assert lone_steps(rec)[:, 1] == pytest.approx([1.2] * 9)  # a's steps after b ended
    # one of a's tokens read 1 ms late: the step before it reads 2.2 ms, the one after
    # 0.2; neither is a row, the steps around them are
    late = list(a)
    late[15] += MS
    rows = steps_seen(records([{"intended": 0, "done": a[-1] + MS, "chunks": late,
                                "prompt": 8}]))
    assert rows[:, 5] == pytest.approx([1.2] * 17)
    # slots: c and d take slots 1 and 0; c ends a step before d (1.2 ms apart, within the
    # window): c's slot was released first, so e, sent after both ended, takes slot 1
    c = [MS + k * step for k in range(5)]
    d = [MS + 50_000 + k * step for k in range(6)]
    slots = records([{"intended": 0, "done": c[-1] + 200_000, "chunks": c},
                     {"intended": 0, "done": d[-1] + 200_000, "chunks": d},
                     {"intended": 20 * MS, "done": 30 * MS, "chunks": [25 * MS]}])
    assert replay_slots(slots, 2).tolist() == [1, 0, 1]
    limits = ServerLimits(SchedulingRule.LLAMA_CPP, 2, 1024, 2048, "test")
    assert steps_seen(slots, limits)[:, 3:5].tolist() == [[1, 1]] * 4 + [[1, 0]]


def test_one_steps_chunks_far_apart_at_the_client_still_read_as_one_step() -> None:
    """On a slowed VM (2026-12-06) a 1-thread model's 45 ms steps sent the ends of two
    streams to the client 2.4 ms apart, past the fixed 1.5 ms window: the window grows
    with a stream's usual gap between chunks (a tenth of it), so they read as one step,
    and the slot replay releases them together, the lower slot first: the next request
    takes slot 0, as llama.cpp gave it. Short steps keep the 1.5 ms window."""
    from servelab.measure.llm_validate import (
        STEP_GROUP_NS,
        replay_slots,
        step_groups,
        step_window_ns,
    )

    step = 45 * MS
    a = [k * step for k in range(10)]  # slot 1 (taken first: the higher id)
    b = [t + 2_400_000 for t in a]  # slot 0, its chunks 2.4 ms behind a's
    rec = records([{"intended": 0, "done": a[-1] + MS, "chunks": a},
                   {"intended": 0, "done": b[-1] + MS, "chunks": b},
                   {"intended": 500 * MS, "done": 600 * MS, "chunks": [550 * MS]}])
    assert step_window_ns(rec, np.arange(2)) == pytest.approx(4.5 * MS)
    assert [len(g) for g in step_groups(rec, np.arange(2))] == [2] * 10
    assert replay_slots(rec, 2).tolist() == [1, 0, 0]
    fast = records([{"intended": 0, "done": 30 * MS, "chunks": [k * 1_200_000
                                                                for k in range(20)]}])
    assert step_window_ns(fast, np.arange(1)) == STEP_GROUP_NS


@st.composite
def stepped_streams(draw):  # type: ignore[no-untyped-def]
    """A server's steps (0.8-20 ms, or 2-60 ms where a prompt comes in) and up to four
    streams, each making a token in every step from its prompt's to its last; each chunk
    reaches the client up to 0.3 ms late. Returns the chunk times and, per step, the
    streams it served."""
    n_streams = draw(st.integers(1, 4))
    n_steps = draw(st.integers(2, 40))
    starts = sorted(draw(st.lists(st.integers(0, n_steps - 2), min_size=n_streams,
                                  max_size=n_streams)))
    ends = [draw(st.integers(a + 1, n_steps - 1)) for a in starts]
    t, times = 0, []
    for j in range(n_steps):
        prompt = j in starts
        t += draw(st.integers(2 * MS if prompt else 800_000, 60 * MS if prompt else 20 * MS))
        times.append(t)
    chunks = [[times[j] + draw(st.integers(0, 300_000)) for j in range(a, b + 1)]
              for a, b in zip(starts, ends, strict=True)]
    served = [{s for s in range(n_streams) if starts[s] <= j <= ends[s]}
              for j in range(n_steps)]
    prompt_steps = [times[j] - times[j - 1] for j in set(starts) if j > 0]
    return chunks, [x for x in served if x], min(prompt_steps, default=60 * MS)


@settings(max_examples=200, deadline=None)
@given(case=stepped_streams())
def test_chunks_group_into_the_steps_that_made_them(case) -> None:  # type: ignore[no-untyped-def]
    """Whatever the steps' lengths against STEP_GROUP_NS and however the chunks of one
    step reach the client (within 0.3 ms), each group is one step's chunks, one a
    stream, and every step is one group."""
    from servelab.measure.llm_validate import step_groups, step_window_ns

    chunks, served, prompt_step = case
    rec = records([{"intended": 0, "done": c[-1] + MS, "chunks": c} for c in chunks])
    # the window grows with the streams' usual gap (STEP_GROUP_SHARE of it): a step where
    # a prompt comes in takes longer than that and the chunks' 0.3 ms (a 2 ms prompt step
    # among 20 ms decode steps ran into the next, where no server's prefill is that quick)
    assume(prompt_step > step_window_ns(rec, np.arange(len(chunks))) + 300_000)
    groups = step_groups(rec, np.arange(len(chunks)))
    assert [{i for _, i, _ in g} for g in groups] == served


def test_given_the_runs_own_steps_the_simulator_is_run_again() -> None:
    """A profile that put decode steps at 5 ms where the load's ran at 10: TPOT misses
    by half on the profile alone, and given the load's own steps (read from the
    streams) it comes back near the measurement."""
    import re

    from servelab.llm.rules import SchedulingRule
    from servelab.llm.serving import ProfileStepModel
    from servelab.measure.llm_validate import (
        Profile,
        ServerLimits,
        _figures,
        given_note,
        given_run_steps,
        simulate_same,
        steps_seen,
    )

    rows = ((8, 0, 0, 10.0), (16, 0, 0, 10.0), (0, 1, 9, 5.0), (0, 2, 18, 5.0))
    p, d, k, ms = (np.array(c, float) for c in zip(*rows, strict=True))
    profile = Profile(tuple(int(x) for x in p), tuple(int(x) for x in d), tuple(k),
                      tuple(ms), 0.0, ProfileStepModel.fit(p, d, k, ms, relative=True), True)
    limits = ServerLimits(SchedulingRule.LLAMA_CPP, 4, 1024, 2048, "test")
    steps = range(10, 310, 10)  # both prompts in the first 10 ms step, then 29 decodes
    rec = records([{"intended": 0, "done": 300 * MS, "chunks": [x * MS for x in steps],
                    "prompt": 8},
                   {"intended": 0, "done": 300 * MS, "chunks": [x * MS + 100 for x in steps],
                    "prompt": 8}])
    alone = _figures(rec, simulate_same(rec, limits, profile), profile.overhead_ms)
    seen = steps_seen(rec)
    given = given_run_steps(rec, seen, limits, profile)
    assert seen.shape[0] == 29
    [note] = given_note(seen.shape[0], given, alone)
    tpot_given, tpot_alone = (float(x) for x in re.search(
        r"TPOT p50 ([-+0-9.]+)% \(profile alone ([-+0-9.]+)%\)", note).groups())
    assert tpot_alone < -25  # the profile's 5 ms decodes (fitted to 6.7) against 10 measured
    assert abs(tpot_given) < 10
    [tpot] = [f for f in given if f.name == "TPOT p50 (ms)"]
    assert tpot.error_pct == pytest.approx(tpot_given, abs=0.05)
    few = records([{"intended": 0, "done": 30 * MS, "chunks": [10 * MS, 20 * MS],
                    "prompt": 8}])
    assert steps_seen(few).shape[0] == 1
    assert given_run_steps(few, steps_seen(few), limits, profile) == ()
    assert given_note(1, (), alone) == ()


def test_the_first_profiles_figures_stand_beside_the_profile_measured_again():
    """validate's profile again before a step (the server's speed moved since the first):
    the step's figures come from the new profile, and the note keeps the first one's. A
    server whose decode steps went from 5 ms to 10 ms: the first profile misses TPOT by
    half, the profile measured again holds it, and the note says both."""
    import re

    from servelab.llm.rules import SchedulingRule
    from servelab.llm.serving import ProfileStepModel
    from servelab.measure.llm_validate import (
        Profile,
        ServerLimits,
        _figures,
        first_profile_note,
        simulate_same,
    )

    def profile(decode_ms: float) -> Profile:
        rows = ((8, 0, 0, 10.0), (16, 0, 0, 10.0), (0, 1, 9, decode_ms), (0, 2, 18, decode_ms))
        p, d, k, ms = (np.array(c, float) for c in zip(*rows, strict=True))
        return Profile(tuple(int(x) for x in p), tuple(int(x) for x in d), tuple(k),
                       tuple(ms), 0.0, ProfileStepModel.fit(p, d, k, ms, relative=True), True)

    limits = ServerLimits(SchedulingRule.LLAMA_CPP, 4, 1024, 2048, "test")
    steps = range(10, 310, 10)
    rec = records([{"intended": 0, "done": 300 * MS, "chunks": [x * MS for x in steps],
                    "prompt": 8}])
    first, again = profile(5.0), profile(10.0)
    was = _figures(rec, simulate_same(rec, limits, first), 0.0)
    now = _figures(rec, simulate_same(rec, limits, again), 0.0)
    [note] = first_profile_note(was, now)
    tpot_first, tpot_again = (float(x) for x in re.search(
        r"TPOT p50 ([-+0-9.]+)% \(again ([-+0-9.]+)%\)", note).groups())
    assert tpot_first == pytest.approx(-50, abs=2)
    assert abs(tpot_again) < 2
    assert first_profile_note((), now) == ()


def test_records_and_profiles_read_back_from_their_json():
    """`llm validate --out` keeps each step's records and validation.json each profile's
    rows: read back, they give the same figures and the same fit."""
    import json
    from dataclasses import replace

    from servelab.llm.rules import SchedulingRule
    from servelab.measure.llm_validate import Profile, ServerLimits, _figures, simulate_same

    rec = replace(records([
        {"intended": 0, "done": 300 * MS, "chunks": [x * MS for x in range(10, 310, 10)],
         "prompt": 8, "cached": 0},
        {"intended": 5 * MS, "sent": 6 * MS, "done": 90 * MS, "chunks": [], "prompt": 8,
         "output": 0, "error": "HTTP 503"}]),
        t0_ns=123, server_prompt_ms=np.array([4.5, -1.0]), server_decode_ms=None)
    back = RunRecords.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert back.to_dict() == rec.to_dict()
    assert compute(back).to_dict() == compute(rec).to_dict()

    def profile(decode_ms: float) -> Profile:
        return Profile.fitted([8, 16, 0, 0], [0, 0, 1, 2], [0, 0, 9, 18],
                              [10.0, 12.0, decode_ms, decode_ms + 1], [1, 1, 1, 1],
                              [1, 1, 0, 1], 2.0, True)

    a, b = profile(5.0), profile(7.0)
    again = Profile.from_dict(json.loads(json.dumps(a.to_dict())))
    assert again.to_dict() == a.to_dict()
    assert a.model.row_ms(0, 1, 9, 1, 0) < b.model.row_ms(0, 1, 9, 1, 0)
    limits = ServerLimits(SchedulingRule.LLAMA_CPP, 4, 1024, 2048, "test")
    assert _figures(back, simulate_same(back, limits, again), again.overhead_ms) == \
        _figures(rec, simulate_same(rec, limits, a), a.overhead_ms)


def test_the_profile_measures_the_slow_steps_after_a_prompt():
    """A lone stream's first decode steps after its prompt, each against its steps past
    SKIP_GAPS: the median over the profile's runs, none below 0, kept with the profile
    (its JSON, the pooled profiles, the fitted scenario) and handed to the step model.
    On the Intel VM of 2026-12-04 the first took twice the later ones (2-layer model)."""
    import json
    from dataclasses import replace

    from servelab.measure.llm_validate import (
        AFTER_PREFILL_STEPS,
        SKIP_GAPS,
        Profile,
        ServerLimits,
        after_prefill_extra_ms,
        after_prefill_ms,
        pooled_after_prefill,
    )

    def stream(first: list[float], later: float, n: int = 40) -> dict[str, object]:
        gaps = [*first, *([later] * (n - 1 - len(first)))]
        chunks = np.cumsum([30.0, *gaps]) * MS
        return {"intended": 0, "done": int(chunks[-1]) + MS,
                "chunks": [int(c) for c in chunks]}

    rec = records([stream([4.0, 3.4, 2.4, 2.1], 2.0), stream([3.0, 2.0, 2.0, 2.0], 2.0),
                   stream([1.5, 1.0], 2.0)])
    assert after_prefill_extra_ms(rec, 0) == pytest.approx([2.0, 1.4, 0.4, 0.1])
    assert after_prefill_extra_ms(rec, 1) == pytest.approx([1.0, 0.0, 0.0, 0.0])
    # the median of the runs, and none below 0
    assert after_prefill_ms([after_prefill_extra_ms(rec, i) for i in range(3)]) == \
        pytest.approx((1.0, 0.0, 0.0, 0.0))
    assert after_prefill_ms([after_prefill_extra_ms(rec, 2)]) == (0.0, 0.0, 0.0, 0.0)
    # too short a stream, or several tokens a chunk: nothing told
    short = records([stream([4.0], 2.0, n=SKIP_GAPS + 1)])
    assert np.isnan(after_prefill_extra_ms(short, 0)).all()
    assert after_prefill_ms([after_prefill_extra_ms(short, 0)]) == ()
    bunched = replace(rec, output_tokens=rec.output_tokens * 4)
    assert np.isnan(after_prefill_extra_ms(bunched, 0)).all()
    assert after_prefill_extra_ms(rec, 0).size == AFTER_PREFILL_STEPS
    # pooled: the mean of the profiles that have it
    assert pooled_after_prefill([(2.0, 1.0), (), (1.0, 0.0, 5.0)]) == (1.5, 0.5)
    assert pooled_after_prefill([(), ()]) == ()
    # kept with the profile and in its model
    prof = Profile.fitted([8, 16, 0, 0], [0, 0, 1, 2], [0, 0, 9, 18], [10.0, 12.0, 5.0, 6.0],
                          [1, 1, 1, 1], [1, 1, 0, 1], 2.0, True, (2.0, 1.0))
    assert prof.model.after_prefill_ms == (2.0, 1.0)
    back = Profile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert back.after_prefill_ms == (2.0, 1.0)
    assert back.model.after_prefill_ms == (2.0, 1.0)
    assert Profile.pooled(prof, back).model.after_prefill_ms == (2.0, 1.0)
    from servelab.llm.rules import SchedulingRule

    limits = ServerLimits(SchedulingRule.LLAMA_CPP, 4, 1024, 2048, "test")
    toml = prof.scenario_toml(limits, "http://x", rate=1.0, prompt_tokens=128,
                              output_tokens=32)
    assert "after_prefill_ms = [2, 1]" in toml


def test_validates_prompt_index_ranges_do_not_overlap():
    """Each kind of request validate sends (the load's, the profile's, the probes', the
    slot touches', the profile again before each of up to 10 steps and after the last)
    draws its prompts from its own range of indices, each seed from its own part of it: a
    shared index is a shared first words, which llama.cpp serves from its cache (until
    2026-12-04 the profile again began on the slot touches' indices, then past the words'
    last index)."""
    from servelab.measure import llm_validate as v
    from servelab.measure.llm_workload import _INDEX_WORDS, words

    every_seed = v.SEED_SPREAD * v.SEED_STRIDE
    ranges = sorted([(0, v.PROFILE_INDEX),  # the load steps' prompts count up from 0
                     (v.PROFILE_INDEX, v.PROFILE_INDEX + every_seed),
                     (v.PROBE_INDEX, v.PROBE_INDEX + every_seed),
                     (v.TOUCH_INDEX, v.TOUCH_INDEX + every_seed),
                     (v.REPROFILE_INDEX, v.REPROFILE_INDEX + 11 * v.REPROFILE_SPAN)])
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert end <= start
    # the words spell indices up to about 40M (validate once stopped on 40,003,000)
    assert ranges[-1][1] <= len(words()) ** _INDEX_WORDS
    assert every_seed <= v.REPROFILE_SPAN


@pytest.mark.parametrize("slots", [1, 2, 4, 5, 76, 77, 256, 257, 1024, 1_000_000])
def test_a_profile_and_its_slot_touches_keep_to_their_seeds_indices(slots: int) -> None:
    """A profile of any server, every mixed row tried MIXED_TRIES times, and a llama.cpp
    server's slot touches before each of up to 10 steps and the saturation run, stay
    within one seed's SEED_STRIDE indices (until 2026-12-06 a profile of more than 76
    slots ran into the next seed's); the profile runs at most PROFILE_MAX_SEQS at once."""
    from servelab.measure import llm_validate as v

    assert v.profile_indices(slots) <= v.SEED_STRIDE
    assert max(v.profile_levels(slots)) == min(slots, v.PROFILE_MAX_SEQS)
    assert all(c + 1 <= min(slots, v.PROFILE_MAX_SEQS) for c in v.mixed_counts(slots))
    assert 11 * v.LLAMA_CPP_MAX_SLOTS <= v.SEED_STRIDE


def test_a_llama_cpp_server_of_more_slots_than_validate_touches_is_refused() -> None:
    from servelab.llm.rules import SchedulingRule
    from servelab.measure import llm_validate as v
    from servelab.measure.llm_load import new_session

    async def limits(slots: int):  # type: ignore[no-untyped-def]
        async with new_session(4) as s:  # nothing listens on port 9: /props is not read
            return await v.discover_limits(s, "http://127.0.0.1:9", SchedulingRule.LLAMA_CPP,
                                           slots, 512, None)

    assert asyncio.run(limits(v.LLAMA_CPP_MAX_SLOTS)).slots == v.LLAMA_CPP_MAX_SLOTS
    with pytest.raises(InputError, match="-np 256 or fewer") as e:
        asyncio.run(limits(v.LLAMA_CPP_MAX_SLOTS + 1))
    assert "--max-num-seqs = 257" in str(e.value)


def test_a_decode_row_is_a_typical_run_not_the_best():
    """A load's TPOT averages the steps its streams got, so each decode row is the median
    of its runs: the least of two read the step low (TPOT p50 at 30% load came out short
    in 7 of 9 bench runs, 2026-12-04), and one slow run of three (one came out 55% slow)
    still does not set the row."""
    from servelab.measure.llm_validate import DECODE_REPEATS, decode_row_ms

    assert DECODE_REPEATS >= 3  # a median that can set one outlier aside
    assert decode_row_ms([5.0, 5.4, 5.2]) == 5.2
    assert decode_row_ms([5.0, 8.4, 5.2]) == 5.2  # one run 60% slow
    assert decode_row_ms([2.0, 5.3, 5.2]) == 5.2  # one run caught a moment's speed


def test_a_mixed_step_is_taken_only_where_the_prompt_joined_the_stream():
    """The profile's mixed row is the stream's gap that the joining prompt's first token
    ends, and only where that gap stands out from its decode steps: a stream that ended
    before the prompt came (all gaps alike) gives no row, where it once gave a 5 ms
    "mixed step" that pulled the whole fit to 0 (CI, 2026-12-04)."""
    from servelab.measure.llm_validate import joined_gap

    ms = 1_000_000
    steady = np.cumsum(np.full(40, 5 * ms))
    assert joined_gap(steady, int(steady[12])) is None
    jittered = np.cumsum(5 * ms + np.random.default_rng(0).integers(-ms, ms, 40))
    assert joined_gap(jittered, int(jittered[12])) is None
    joined = np.cumsum(np.r_[np.full(12, 5 * ms), 95 * ms, np.full(20, 6 * ms)])
    # between the 12th chunk and the 13th, which came with the prompt's first token
    assert joined_gap(joined, int(joined[12]) + ms // 2) == 11
    assert joined_gap(np.array([0, 5 * ms, 10 * ms]), 10 * ms) is None  # too short to tell
    # a gap that stands out, but the prompt's first token came after the stream ended:
    # a hiccup, not the prompt (it gave a 10.6 ms "mixed step" of a 193-token prompt on
    # the AMD VM, 2026-12-04, and pulled the fit of every prefill 80-90% short)
    hiccup = np.cumsum(np.r_[np.full(30, 3.5 * ms), 10.6 * ms, np.full(5, 3.5 * ms)])
    assert joined_gap(hiccup, int(hiccup[-1]) + 40 * ms) is None
    assert joined_gap(joined, int(joined[12]) + 40 * ms) is None  # ran apart from it
    # the joined step, then a longer stall after the prompt's request ended (the client's
    # own, 55-64 ms, before 2026-12-04): the step is the one the first token ends
    stalled = np.cumsum(np.r_[np.full(12, 3.5 * ms), 48 * ms, 7 * ms, 64 * ms,
                              np.full(10, 0.05 * ms), np.full(10, 3.5 * ms)])
    assert joined_gap(stalled, int(stalled[12]) + int(4.7 * ms)) == 11
    # 2 ms steps (a 2-layer model, the Intel VM, 2026-12-04): the prompt's first chunk
    # 4.7 ms off the stream's is still within the window (two steps would be 4 ms)
    fast = np.cumsum(np.r_[np.full(30, 2 * ms), 50 * ms, np.full(30, 2 * ms)])
    assert joined_gap(fast, int(fast[30]) + int(4.7 * ms)) == 29
    # and a hiccup near it that is far shorter than the prompt's own 50 ms is no row (an
    # 8.8 ms one once stood for a 193-token prompt, and the fit missed by 161%)
    hic = np.cumsum(np.r_[np.full(30, 2 * ms), 8.8 * ms, np.full(30, 2 * ms)])
    assert joined_gap(hic, int(hic[30]), prompt_ns=50 * ms) is None
    assert joined_gap(hic, int(hic[30])) == 29  # without the server's time it cannot tell
    assert joined_gap(fast, int(fast[30]), prompt_ns=50 * ms) == 29


# A profile measured on the AMD VM, 2026-12-04 (bench run, the profile after a step):
# (prefill tokens, decodes, KV tokens read, step ms, passes, multi-token passes). Its
# 193-token mixed row (10.56 ms) was a hiccup in a stream that ended before the prompt came.
HICCUP_PROFILE = [
    (65, 0, 0, 47.02, 1, 1), (129, 0, 0, 85.19, 1, 1), (193, 0, 0, 127.25, 1, 1),
    (321, 0, 0, 214.39, 1, 1), (449, 0, 0, 298.69, 1, 1), (0, 1, 61, 3.47, 1, 0),
    (0, 2, 122, 6.99, 1, 1), (0, 3, 183, 6.67, 1, 1), (0, 4, 244, 7.03, 1, 1),
    (0, 1, 477, 3.93, 1, 0), (0, 2, 954, 7.96, 1, 1), (0, 3, 1431, 8.38, 1, 1),
    (0, 4, 1908, 9.62, 1, 1), (65, 1, 188, 69.2, 2, 2), (65, 3, 348, 66.02, 2, 2),
    (193, 1, 80, 10.56, 2, 2), (193, 3, 351, 124.1, 2, 2)]


def test_a_fit_that_misses_its_own_profile_says_which_row():
    """One row the server did not run as profiled pulls the relative fit of every other
    far off: with the hiccup row the fit put every prefill 80-90% short (TTFT p50 -85%
    in that bench run); the report names the row, and without it says nothing."""
    from servelab.measure.llm_validate import FIT_NOTE_PCT, Profile

    def fitted(rows):  # type: ignore[no-untyped-def]
        return Profile.fitted(*zip(*rows, strict=True), overhead_ms=2.0, server_timed=True)

    bad = fitted(HICCUP_PROFILE)
    assert bad.model.row_ms(449, 0, 0) < 0.2 * 298.69  # the damage, as it was
    (note,) = bad.fit_note()
    assert "the row of 193 prompt tokens and 1 decodes (10.6 ms)" in note
    good = fitted([r for r in HICCUP_PROFILE if r[3] != 10.56])
    assert good.model.max_abs_error_pct <= FIT_NOTE_PCT
    assert good.fit_note() == ()
    assert good.model.row_ms(449, 0, 0) == pytest.approx(298.69, rel=0.1)


def test_a_mixed_rows_streams_outlast_the_prompt_joining_them():
    """The running streams of a mixed row last MIXED_MARGIN times past the moment the
    prompt, sent MIXED_DELAY_S after them, has had its prefill: at 160 tokens of 3.5 ms
    steps a stream had ended before the prompt came (the AMD VM, 2026-12-04)."""
    from servelab.measure.llm_validate import (
        MIXED_DELAY_S,
        MIXED_MARGIN,
        MIXED_TOKENS,
        MIXED_TOKENS_MAX,
        mixed_stream_tokens,
    )

    for step_ms, prefill_ms in ((3.5, 130.0), (5.0, 240.0), (12.0, 300.0), (0.5, 20.0)):
        n = mixed_stream_tokens(step_ms, prefill_ms, room=10_000)
        assert MIXED_TOKENS <= n <= MIXED_TOKENS_MAX
        if n < MIXED_TOKENS_MAX:
            assert n * step_ms >= MIXED_MARGIN * (MIXED_DELAY_S * 1e3 + prefill_ms)
    assert mixed_stream_tokens(3.5, 130.0, room=10_000) > 300  # 160 ended too soon
    assert mixed_stream_tokens(3.5, 130.0, room=200) == 200  # what the slot holds
    assert mixed_stream_tokens(math.nan, 130.0, room=10_000) == MIXED_TOKENS
    assert mixed_stream_tokens(1e-9, 1e12, room=10_000) == MIXED_TOKENS_MAX


def test_slots_are_replayed_by_least_recent_release() -> None:
    """llama.cpp gives a request the idle slot released longest ago (of never-used slots
    the highest id); a request finding every slot busy waits for the first to free."""
    from servelab.measure.llm_validate import replay_slots

    rec = records([{"intended": 0, "done": 10 * MS, "chunks": [9 * MS]},
                   {"intended": 0, "done": 20 * MS, "chunks": [19 * MS]},
                   {"intended": 30 * MS, "done": 40 * MS, "chunks": [31 * MS]},
                   {"intended": 30 * MS, "done": 40 * MS, "chunks": [31 * MS]},
                   {"intended": 35 * MS, "done": 50 * MS, "chunks": [41 * MS]},
                   {"intended": 0, "done": 1, "chunks": [], "error": "HTTP 500"}])
    # three slots: r0, r1 -> slots 2, 1; at 30 ms r2 -> slot 0 (never used), r3 -> slot
    # 2 (released at 9 ms, before slot 1 at 19); r4 at 35 ms -> slot 1
    assert replay_slots(rec, 3).tolist() == [2, 1, 0, 2, 1, -1]
    # two slots: r0, r1 -> 1, 0; r2 -> 1 (released first), r3 -> 0; r4 finds both busy
    # and waits to 31 ms, when r2 and r3 end in one step: the server releases slot 0
    # before slot 1 (it walks its slots in order), so r4 takes slot 0
    assert replay_slots(rec, 2).tolist() == [1, 0, 1, 0, 0, -1]


def test_streams_ending_in_one_step_free_their_slots_in_slot_order() -> None:
    """Two streams whose last tokens came from one step: the server released the lower
    slot first, whichever end the client read first (CI, 2026-12-04: the end on slot 3
    read 0.1 ms before the one on slot 0, and the next request took slot 0)."""
    from servelab.measure.llm_validate import replay_slots

    rec = records([{"intended": 0, "done": 10 * MS, "chunks": [MS]},  # -> slot 1
                   {"intended": 0, "done": 10 * MS, "chunks": [MS]},  # -> slot 0
                   # both end in the step at 20 ms; slot 0's end reaches the client last
                   {"intended": 5 * MS, "done": 25 * MS, "chunks": [20 * MS + 100_000]},
                   {"intended": 5 * MS, "done": 25 * MS, "chunks": [20 * MS]},
                   {"intended": 30 * MS, "done": 40 * MS, "chunks": [35 * MS]}])
    # r0, r1 (one step, 1 ms) free slots 0 then 1: r2 -> 0, r3 -> 1; r2 (slot 0) and
    # r3 (slot 1) end in one step, r3 read first: slot 0 is still the older, r4 -> 0
    assert replay_slots(rec, 2).tolist() == [1, 0, 0, 1, 0]
    # a step apart (5 ms), the client's order holds: r3 first, so r4 -> slot 1
    apart = records([{"intended": 0, "done": 10 * MS, "chunks": [MS]},
                     {"intended": 0, "done": 10 * MS, "chunks": [MS]},
                     {"intended": 5 * MS, "done": 25 * MS, "chunks": [25 * MS]},
                     {"intended": 5 * MS, "done": 25 * MS, "chunks": [20 * MS]},
                     {"intended": 30 * MS, "done": 40 * MS, "chunks": [35 * MS]}])
    assert replay_slots(apart, 2).tolist() == [1, 0, 0, 1, 1]


def test_a_run_inside_another_leaves_the_collection_to_the_outer():
    """A load run pauses garbage collection and collects on its way out; a run inside
    another (validate's mixed rows send a prompt while streams run) once collected on
    its way out and stalled the outer run's streams 55-64 ms, which the profile read as a
    64-token prompt's step. Only the outermost run collects, once, after its end."""
    import gc

    from servelab.measure.loadgen import paused_gc

    collections: list[str] = []

    def seen(phase: str, info: dict) -> None:  # type: ignore[type-arg]
        if phase == "start":
            collections.append(phase)

    gc.callbacks.append(seen)
    try:
        assert gc.isenabled()
        with paused_gc():
            with paused_gc():
                assert not gc.isenabled()
            assert not gc.isenabled()
            assert collections == []  # the inner run's end: no collection
        assert collections == ["start"]
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(seen)
        gc.enable()


def test_a_p50_in_a_gap_of_its_distribution_is_noted_with_the_per_request_error():
    """At 30% load about half the requests decode alone and half share steps with
    another's prompt: the TPOT p50 sits between the groups, and one request more in
    either moves it past the bar whatever the model. The note says so and gives the
    prediction request by request; a p50 inside one group is no edge."""
    from servelab.measure.llm_validate import edge_note

    rng = np.random.default_rng(1)
    alone = rng.normal(4.0, 0.2, 60)
    shared = rng.normal(6.8, 0.4, 60)
    measured = np.r_[alone, shared]
    predicted = measured * rng.normal(1.0, 0.03, 120)  # each request within a few %
    note = edge_note("TPOT", measured, predicted)
    assert note is not None
    assert note.startswith("TPOT p50 sits in a gap")
    each = float(note.split("within ")[1].split("%")[0])
    assert 0 < each <= 4
    assert edge_note("TPOT", np.r_[alone, alone, shared[:20]], np.r_[alone, alone,
                                                                     shared[:20]]) is None
    assert edge_note("TTFT", np.full(5, 90.0), np.full(5, 80.0)) is None  # too few to say
    nan = np.r_[np.full(100, math.nan), measured[:8]]  # requests with no figure are left out
    assert edge_note("TTFT", nan, nan) is None


def test_the_servers_speed_moving_within_a_step_is_noted():
    """Lone streams (one token a step, nothing else in the step) track the machine's
    speed through a load step; where their 5-second medians differ by more than 15%
    the report says the machine moved during the load. A stream that shares its steps
    with another's is no lone step."""
    from servelab.measure.llm_validate import lone_speed, lone_steps, speed_note, spread_pct

    def stream(start_ms: float, step_ms: float, n: int = 60) -> dict[str, object]:
        chunks = [int((start_ms + 90 + k * step_ms) * MS) for k in range(n)]
        return {"intended": int(start_ms * MS), "done": chunks[-1] + MS, "chunks": chunks}

    # a lone stream every 2 s for 30 s: 3.5 ms steps, then 4.9 ms from 15 s on
    slow = records([stream(t * 1000.0, 3.5 if t < 15 else 4.9) for t in range(0, 30, 2)])
    rows = lone_steps(slow)
    assert rows.shape == (15 * 59, 2)
    assert set(np.round(rows[:, 1], 3)) == {3.5, 4.9}
    (note,) = speed_note(lone_speed(slow))
    assert "3.50-4.90 ms" in note
    assert "+40%" in note
    assert lone_speed(slow) == pytest.approx((3.5, 4.9))
    assert spread_pct(lone_speed(slow)) == pytest.approx(40.0)
    steady = records([stream(t * 1000.0, 3.5 + 0.1 * (t % 3)) for t in range(0, 30, 2)])
    assert speed_note(lone_speed(steady)) == ()
    assert 0 < spread_pct(lone_speed(steady)) <= 0.2 / 3.5 * 100  # window medians
    # two streams in the same steps: no lone step, nothing to say
    both = records([stream(0.0, 3.5), stream(0.0, 3.5)])
    assert lone_steps(both).shape == (0, 2)
    assert speed_note(lone_speed(both)) == ()
    assert lone_speed(both) is None
    assert spread_pct(None) is None
    # one window alone cannot say the speed moved
    assert lone_speed(records([stream(0.0, 3.5)])) is None


def test_the_verdict_says_when_every_miss_came_with_the_machine_moving():
    """A step whose server speed moved more than SPEED_NOTE_PCT within it is no test of
    the model alone (on an Intel VM, 2026-12-04, six quiet runs met the whole bar
    within 6%; the two whose speed moved 58-151% missed): the verdict says so when
    every miss came in such a step, and only then; the diagnosis says it beside "the
    step times are off"."""
    import json

    from servelab.llm.rules import SchedulingRule
    from servelab.measure.llm_validate import (
        SPEED_NOTE_PCT,
        Compared,
        LlmValidationReport,
        Profile,
        RateResult,
        ServerLimits,
        _diagnose,
    )

    ok, miss = Compared("TPOT p50 (ms)", 10.0, 10.2, 10.0), Compared("TPOT p50 (ms)", 8.0,
                                                                       10.0, 10.0)
    assert ok.ok
    assert not miss.ok

    def step(fig: Compared, lone: tuple[float, float] | None) -> RateResult:
        return RateResult(1.0, 0.3, (fig,), 100, 100.0, 1.0, 0, lone_step_ms=lone)

    moved, held = (8.0, 13.0), (8.0, 8.0 * (1 + SPEED_NOTE_PCT / 100))
    assert not step(miss, moved).steady
    assert step(miss, held).steady
    assert step(miss, None).steady  # nothing told otherwise
    limits = ServerLimits(SchedulingRule.LLAMA_CPP, 4, 1024, 2048, "test")
    prof = Profile.fitted([8, 16, 0, 0], [0, 0, 1, 2], [0, 0, 9, 18], [10.0, 12.0, 5.0, 6.0],
                          [1, 1, 1, 1], [1, 1, 0, 1], 2.0, True)

    def verdict(sat: Compared, *rates: RateResult) -> str:
        r = LlmValidationReport("http://x/v1/completions", "m", limits, prof, sat, rates,
                                128, 32, 1.0, 128.0, 32.0)
        assert json.loads(json.dumps(r.to_dict()))["verdict"] == r.verdict
        return r.verdict

    sat = Compared("saturation (req/s)", 3.0, 3.0, 10.0)
    assert verdict(sat, step(ok, moved)) == "holds"
    machine = verdict(sat, step(miss, moved), step(ok, held))
    assert machine.startswith("misses on 1 of 3 figures, each in a step where the server's "
                              "own speed moved (up to +62% within it)")
    # a miss in a steady step, or a missed saturation (its own closed loop): the model's
    assert verdict(sat, step(miss, moved), step(miss, held)) == "misses on 2 of 3 figures"
    assert verdict(Compared("saturation (req/s)", 2.0, 3.0, 10.0),
                   step(miss, moved)) == "misses on 2 of 2 figures"
    d = step(miss, moved).to_dict()
    assert d["lone_step_ms"] == [8.0, 13.0]
    assert d["steady"] is False
    assert d["speed_spread_pct"] == pytest.approx(62.5)
    # the diagnosis of a TPOT miss with the steps agreeing
    (sched, why) = _diagnose((miss,), 100, 100.0, 1.0, speed_spread_pct=62.5)
    assert sched.startswith("scheduling: 100 steps simulated")
    assert why.startswith("step model: the steps agree but TPOT misses; the step times are "
                          "off, and the server's own speed moved +62% within this step")
    assert _diagnose((miss,), 100, 100.0, 1.0, speed_spread_pct=5.0)[1].endswith("are off")


def test_who_decoded_through_anothers_prompt_is_counted_each_way():
    """A request decoded through another's prompt where that one's first token came out
    after its own first and no later than its last: on the streams' chunk times (a step's
    chunks within STEP_GROUP_NS of each other) and on the simulator's token times for the
    same requests. The note says whether the decode spans differ too (the steps' speed)
    or not (the scheduling rule)."""
    from servelab.llm.serving import ServingResult
    from servelab.measure.llm_validate import (
        SharedSteps,
        shared_note,
        shared_steps,
        through_prompts,
    )

    def req(intended: float, chunks: list[float]) -> dict[str, object]:
        return {"intended": int(intended * MS), "done": int((chunks[-1] + 1) * MS),
                "chunks": [int(c * MS) for c in chunks]}

    rec = records([
        req(0, [10, 20, 30, 40, 50]),  # A: B's first token at 30 came out in its decode
        req(0, [10.5, 20.5]),  # D: first in A's first step, ended before B's: alone
        req(15, [30, 40, 50, 60]),  # B: E's first came out in the step of its last
        req(45, [60.3, 70.3]),  # E
        req(100, [110, 120]),  # C: alone
    ])

    def sim(ttft_ms: list[float], e2e_ms: list[float]) -> ServingResult:
        z = np.zeros(5)
        return ServingResult(z, np.array(ttft_ms) / 1e3, z, np.array(e2e_ms) / 1e3, z,
                             z.astype(bool), z, 0, 0.0, 0.0, 0.0, 0, 0)

    # simulated: A ends at 25 ms, before B's first at 30; B's last and E's first both 60
    s = shared_steps(rec, sim([10, 10, 15, 15, 10], [25, 20, 45, 25, 20]))
    assert s == SharedSteps(2, 1, 5, pytest.approx(20.0), pytest.approx(15.0))
    assert shared_note(s) == ()  # one request apart: too few to say
    (note,) = shared_note(SharedSteps(91, 82, 120, 273.0, 210.0))  # the 2-layer run
    assert "91 of 120 measured, 82 simulated" in note
    assert "(-23%)" in note
    assert "the steps' speed" in note
    # the same spans and other counts: the scheduling
    (note,) = shared_note(SharedSteps(30, 40, 100, 200.0, 205.0))
    assert "points at the scheduling rule" in note
    assert shared_note(SharedSteps(30, 34, 100, 200.0, 300.0)) == ()  # under 5 apart
    assert shared_note(SharedSteps(300, 340, 1000, 200.0, 300.0)) == ()  # under 5%
    assert shared_note(SharedSteps(300, 350, 1000, 200.0, 300.0)) != ()
    assert shared_note(None) == ()
    # in the step's JSON
    from servelab.measure.llm_validate import Compared, RateResult

    fig = Compared("TPOT p50 (ms)", 10.0, 10.0, 10.0)
    d = RateResult(1.0, 0.3, (fig,), 100, 100.0, 1.0, 0, shared=s).to_dict()
    assert d["shared_prompt_steps"]["measured"] == 2
    assert d["shared_prompt_steps"]["span_measured_ms"] == pytest.approx(20.0)
    assert RateResult(1.0, 0.3, (fig,), 100, 100.0, 1.0, 0).to_dict()[
        "shared_prompt_steps"] is None
    # the counting alone, in any unit; a request never counts its own first token
    first, last = np.array([0.0, 5.0, 5.0, 20.0]), np.array([10.0, 9.0, 30.0, 25.0])
    assert through_prompts(first, last, 0.0).tolist() == [True, False, True, False]
    # requests with fewer than two tokens either way leave too little to tell
    assert shared_steps(records([req(0, [10])]), sim([10], [10])) is None
