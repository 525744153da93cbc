"""The LLM load generator's workloads: unique prompts, vLLM's length rules, clear errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.errors import InputError
from servelab.measure.llm_load import Endpoint, LoadPlan, counter_diff, parse_counters
from servelab.measure.llm_workload import (
    jsonl_requests,
    random_requests,
    sharegpt_requests,
    words,
)


def test_random_prompts_are_unique_and_sized() -> None:
    reqs = random_requests(500, input_len=64, output_len=32, range_ratio=0.5, seed=3)
    heads = {tuple(r.prompt.split()[:3]) for r in reqs}
    assert len(heads) == 500  # no two share even their first three words
    lens = [len(r.prompt.split()) for r in reqs]
    assert min(lens) >= 32
    assert max(lens) <= 96
    outs = [r.max_tokens for r in reqs]
    assert min(outs) >= 16
    assert max(outs) <= 48
    assert len(set(outs)) > 10


def test_steps_draw_disjoint_prompts_with_one_shared_prefix() -> None:
    a = random_requests(50, input_len=40, output_len=8, prefix_len=20, seed=1)
    b = random_requests(50, input_len=40, output_len=8, prefix_len=20, seed=1, first_index=50)
    prefix = a[0].prompt.split()[:20]
    assert all(r.prompt.split()[:20] == prefix for r in a + b)
    assert not {r.prompt for r in a} & {r.prompt for r in b}
    assert not {tuple(r.prompt.split()[20:23]) for r in a} & {
        tuple(r.prompt.split()[20:23]) for r in b}


def test_tokens_per_word_scales_the_words() -> None:
    (r,) = random_requests(1, input_len=100, output_len=8, tokens_per_word=2.0)
    assert len(r.prompt.split()) == 50


def test_vocabulary_is_plain_words() -> None:
    assert len(words()) > 300
    assert all(w.isalpha() and w.islower() for w in words())


@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"input_len": 0}, "--random-input-len"), ({"output_len": 10**6}, "--random-output-len"),
    ({"range_ratio": 1.0}, "--random-range-ratio"), ({"range_ratio": -0.1},
                                                     "--random-range-ratio"),
    ({"prefix_len": -1}, "--random-prefix-len"), ({"seed": -1}, "--seed"),
    ({"input_len": 200_000}, "--num-prompts"),
])
def test_random_mistakes_name_the_flag(kwargs: dict[str, float], flag: str) -> None:
    args: dict[str, float] = {"input_len": 10, "output_len": 10, **kwargs}
    with pytest.raises(InputError, match=flag):
        random_requests(200, **args)  # type: ignore[arg-type]


def test_sharegpt_applies_vllms_filters(tmp_path: Path) -> None:
    conv = [{"conversations": [{"from": "human", "value": "word " * 20},
                               {"from": "gpt", "value": "reply " * 30}]},
            {"conversations": [{"from": "human", "value": "hi"},  # prompt under 4 tokens
                               {"from": "gpt", "value": "reply " * 30}]},
            {"conversations": [{"from": "human", "value": "w " * 2000},  # over 1,024
                               {"from": "gpt", "value": "reply " * 30}]},
            {"nope": 1}, "not a dict"]
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(conv))
    reqs = sharegpt_requests(p, 5, tokens_per_word=1.0)
    assert len(reqs) == 5
    assert all(r.prompt == "word " * 20 for r in reqs)
    assert reqs[0].max_tokens == 30
    assert sharegpt_requests(p, 1, output_len=7)[0].max_tokens == 7


@pytest.mark.parametrize("text", ["{", "{}", "[]", '[{"conversations": 3}]'])
def test_bad_sharegpt_is_one_line(tmp_path: Path, text: str) -> None:
    p = tmp_path / "sg.json"
    p.write_text(text)
    with pytest.raises(InputError, match="--dataset-path"):
        sharegpt_requests(p, 3)


def test_jsonl(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "a b c", "output_tokens": 4}\n\n{"prompt": "d", '
                 '"output_tokens": 2}\n')
    reqs = jsonl_requests(p, 3)
    assert [r.max_tokens for r in reqs] == [4, 2, 4]
    p.write_text('{"prompt": "a"}\n')
    with pytest.raises(InputError, match="line 1"):
        jsonl_requests(p, 1)
    with pytest.raises(InputError, match="a regular file"):
        jsonl_requests(tmp_path / "missing.jsonl", 1)


def test_arrivals_as_vllm_draws_them() -> None:
    t = LoadPlan(rate=10.0).offsets_s(1000, seed=0)
    assert t[-1] == pytest.approx(100.0)  # rescaled so the last lands at n / rate
    gaps = np.diff(t)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.1)  # Poisson: cv 1
    bursty = np.diff(LoadPlan(rate=10.0, burstiness=0.25).offsets_s(4000, seed=0))
    assert np.std(bursty) / np.mean(bursty) == pytest.approx(2.0, abs=0.2)  # cv 1/sqrt(k)
    assert not LoadPlan(rate=math.inf).offsets_s(5, 0).any()
    assert list(LoadPlan(schedule_s=(2.0, 2.5, 4.0)).offsets_s(3, 0)) == [0.0, 0.5, 2.0]


@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"rate": 0}, "--request-rate"), ({"rate": -1}, "--request-rate"),
    ({"rate": math.nan}, "--request-rate"), ({"burstiness": 0}, "--burstiness"),
    ({"max_concurrency": -1}, "--max-concurrency"),
    ({"max_concurrency": 10**9}, "--max-concurrency")])
def test_plan_mistakes(kwargs: dict[str, float], flag: str) -> None:
    with pytest.raises(InputError, match=flag):
        LoadPlan(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("url", "path"), [
    ("127.0.0.1:8000", "/v1/completions"), ("ftp://h:1", "/v1/completions"),
    ("http://h:1/v1/completions", "/v1/completions"), ("http://h:1", "/v2/infer")])
def test_endpoint_mistakes(url: str, path: str) -> None:
    with pytest.raises(InputError, match=r"--url|--endpoint"):
        Endpoint.parse(url, path)


def test_server_counters_diffed() -> None:
    page = """# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 100
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 3
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 4
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.5
vllm:time_to_first_token_seconds_count{model_name="m"} 4
# TYPE other_total counter
other_total 5
"""
    after = parse_counters(page)
    assert "other_total" not in after
    assert not any(k.endswith("_bucket") for k in after)
    before = {"llamacpp:prompt_tokens_total": 40.0,
              "vllm:time_to_first_token_seconds_count": 1.0}
    d = counter_diff(before, after)
    assert d["llamacpp:prompt_tokens_total"] == 60
    assert d["llamacpp:requests_processing"] == 2  # a gauge: its value after
    assert d["vllm:time_to_first_token_seconds_count"] == 3
    assert parse_counters("garbage {{{") == {}


def test_engine_times_and_steps_from_the_servers_counters() -> None:
    from servelab.measure.llm_validate import engine_prefill_ms, engine_steps

    # vLLM, over one request alone: its engine's prefill time
    one = {"vllm:request_prefill_time_seconds_sum": 0.0123,
           "vllm:request_prefill_time_seconds_count": 1.0,
           "vllm:iteration_tokens_total_count": 2.0}
    assert engine_prefill_ms(one) == pytest.approx(12.3)
    assert engine_steps(one) == 2.0
    # two requests in the window, or a server that does not say: unknown
    assert engine_prefill_ms({**one, "vllm:request_prefill_time_seconds_count": 2.0}) == -1
    assert engine_prefill_ms({}) == -1
    assert engine_steps({"llamacpp:n_decode_total": 7.0}) == 7.0
    assert engine_steps({}) is None


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), inp=st.integers(1, 300), out=st.integers(1, 300),
       ratio=st.floats(0, 0.99), prefix=st.integers(0, 50), seed=st.integers(0, 2**32 - 1))
def test_random_workload_properties(n: int, inp: int, out: int, ratio: float, prefix: int,
                                    seed: int) -> None:
    reqs = random_requests(n, input_len=inp, output_len=out, range_ratio=ratio,
                           prefix_len=prefix, seed=seed)
    assert len(reqs) == n
    assert len({r.prompt for r in reqs}) == n
    assert all(1 <= r.max_tokens <= out * (1 + ratio) + 1 for r in reqs)


def test_a_step_is_bounded_in_time() -> None:
    LoadPlan(rate=1.0).check_span(80_000)  # under a day
    with pytest.raises(InputError, match="--request-rate"):
        LoadPlan(rate=1e-300).check_span(1)
    with pytest.raises(InputError, match="--trace"):
        LoadPlan(schedule_s=(0.0, 1e6)).check_span(2)
    LoadPlan(schedule_s=(0.0, 1e6)).check_span(1)  # only the requests sent count


def test_a_decode_step_from_bunched_chunks_is_the_span_over_its_tokens() -> None:
    import numpy as np

    from servelab.measure.llm_metrics import RunRecords
    from servelab.measure.llm_validate import SKIP_GAPS, _step_gap_ms

    def rec(chunks_ms: list[float], tokens: int) -> RunRecords:
        ns = np.array(chunks_ms) * 1e6
        one = np.zeros(1, np.int64)
        return RunRecords(one, one, one, (ns.astype(np.int64),), np.array([32]),
                          np.array([tokens]), np.array([-1]), ("",))

    steps = [3.0 * k for k in range(48)]  # a token a chunk every 3 ms
    assert _step_gap_ms(rec(steps, 48), 0) == pytest.approx(3.0)
    # one slow step of 20 ms among 39 mid-stream ones: TPOT pays for it, so the step does
    slow = steps[:30] + [s + 17.0 for s in steps[30:]]
    assert _step_gap_ms(rec(slow, 48), 0) == pytest.approx(3.0 + 17.0 / (47 - SKIP_GAPS))
    # the same 48 tokens every 3 ms, but sent two a chunk after the first SKIP_GAPS + 1:
    # the gaps are 6 ms, so the median gap reads a step twice as long
    bunched = steps[:SKIP_GAPS + 1] + steps[SKIP_GAPS + 2::2] + steps[-1:]
    got = _step_gap_ms(rec(bunched, 48), 0)
    assert got == pytest.approx(3.0)
    assert float(np.median(np.diff(bunched)[SKIP_GAPS:])) > 5  # what the median said
