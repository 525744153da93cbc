"""The lab's JSON API, without a browser: errors are one clear message, TOML parses,
and the read-outs are the same figures the API gives."""

from __future__ import annotations

import warnings

import pytest

from servelab.api import run_plan, run_simulate
from servelab.lab.server import create_app, default_state
from servelab.scenario import load_scenario

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's testclient warns about its httpx backend
    from fastapi.testclient import TestClient


@pytest.fixture(scope="module")
def client():  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TestClient(create_app(), base_url="http://127.0.0.1")


def test_update_is_the_api_report(client):
    r = client.post("/api/update", json={"state": default_state()})
    assert r.status_code == 200
    d = r.json()
    seed = load_scenario("seed")
    # the lab's figures are the API's, the p99's interval included (the Report's own)
    assert d["simulate"] == run_simulate(seed, p99_interval=True).to_dict()
    lo, hi = d["simulate"]["latency"]["p99_interval_ms"]
    assert lo <= d["simulate"]["latency"]["p99_ms"] <= hi
    assert run_simulate(seed).latency.p99_interval_ms is None  # only when asked for
    assert d["plan"]["num_gpus"] == run_plan(seed).plan.num_gpus
    assert d["kv"]["kv"]["bytes_per_token"] == 327_680
    assert d["toml"].startswith('name = "seed"')


def test_bad_state_is_a_400_with_the_scenario_message(client):
    state = {**default_state(), "batching.max_batch_size": 0}
    r = client.post("/api/update", json={"state": state})
    assert r.status_code == 400
    assert r.json()["error"].startswith("[batching] max_batch_size = 0: expected")
    assert r.json()["key"] == "batching.max_batch_size"  # the page marks it, no parsing


def test_switching_model_kind_keeps_working(client):
    state = {**default_state(), "model.kind": "affine", "model.base_ms": 1.0,
             "model.per_row_ms": 0.1}
    r = client.post("/api/update", json={"state": state})
    assert r.status_code == 200
    assert r.json()["state"]["model.kind"] == "affine"
    assert "model.bytes_per_batch" not in r.json()["state"]  # a roofline-only key


def test_parse_toml_and_reject_garbage(client):
    text = load_scenario("seed").with_overrides({"workload.qps": 1234.0})
    from servelab.scenario import scenario_to_toml

    r = client.post("/api/parse", json={"toml": scenario_to_toml(text)})
    assert r.json()["state"]["workload.qps"] == 1234.0
    r = client.post("/api/parse", json={"toml": "[workload\n"})
    assert r.status_code == 400
    assert "not valid TOML" in r.json()["error"]


def test_load_toml_gives_back_the_sections_lab_tables(client):
    """Issue 29: Export writes the drift and paging sections as [lab.*] tables; Load reads
    them back checked, and every command reads the file as the scenario without them."""
    from servelab.files import parse_toml
    from servelab.scenario import scenario_from_dict, scenario_to_toml

    text = scenario_to_toml(load_scenario("seed")) + (
        '\n[lab.drift]\nfeature = "country"\nmissing = 0.2\nrows = 500\n'
        "\n[lab.paging]\nrequests = 300\nprefix_tokens = 64\n")
    r = client.post("/api/parse", json={"toml": text})
    assert r.status_code == 200, r.text
    assert r.json()["lab"] == {"drift": {"feature": "country", "missing": 0.2, "rows": 500},
                               "paging": {"requests": 300, "prefix_tokens": 64}}
    seed = load_scenario("seed")
    assert scenario_from_dict(parse_toml(text, "x"), base_dir=seed.base_dir) == seed
    for bad, said in (('[lab.drift]\nfeature = "zip"', "[lab.drift] feature = 'zip'"),
                      ("[lab.drift]\nmean_shift = 9", "[lab.drift] mean_shift = 9"),
                      ("[lab.paging]\nrequests = 0", "[lab.paging] requests = 0"),
                      ("[lab.pagin]\nrequests = 1", "did you mean 'paging'")):
        r = client.post("/api/parse", json={"toml": bad})
        assert r.status_code == 400, bad
        assert said in r.json()["error"], r.text


def test_charts_and_paging_shapes(client):
    st = default_state()
    c = client.post("/api/charts", json={"state": st}).json()
    windows = [row["max_queue_delay_us"] for row in c["window_sweep"]]
    assert windows == sorted(windows)
    assert 2000 in windows
    p = client.post("/api/paging", json={"state": st}).json()
    assert {r["strategy"] for r in p["results"]} >= {"contiguous_max", "paged"}
    assert p["summary"]["paged_token_share"] > p["summary"]["contiguous_token_share"]


def test_assets_are_local(client):
    assert client.get("/vendor/plotly.min.js").status_code == 200
    html = client.get("/").text
    assert "http://" not in html
    assert "https://" not in html


def test_a_scenario_with_nothing_served_still_answers(client):
    state = {**default_state(), "batching.default_timeout_microseconds": 100,
             "workload.num_requests": 2000}
    for endpoint in ("/api/update", "/api/charts"):
        r = client.post(endpoint, json={"state": state})
        assert r.status_code == 200, r.text
    assert client.post("/api/update", json={"state": state}).json()["simulate"]["latency"][
        "p50_ms"] is None


def test_a_preview_update_is_smaller_says_so_and_the_full_one_is_not(client):
    state = default_state()
    prev = client.post("/api/update", json={"state": state, "preview": True}).json()
    full = client.post("/api/update", json={"state": state}).json()
    assert prev["preview"] is True
    assert prev["simulate"]["requests"]["arrivals"] == 20_000
    assert any(n.startswith("preview while the slider moves") for n in prev["notes"])
    assert full["preview"] is False
    assert full["simulate"]["requests"]["arrivals"] == state["workload.num_requests"]
    # The preview's smaller run is in its read-outs only: the state and the TOML it hands
    # back are the scenario asked for, so a page that adopts them keeps the full size.
    assert prev["state"] == full["state"]
    assert prev["state"]["workload.num_requests"] == state["workload.num_requests"]
    assert prev["toml"] == full["toml"]


def test_a_capped_update_says_so_and_keeps_the_asked_size_in_its_state(client):
    state = {**default_state(), "workload.num_requests": 4_000_000, "workload.qps": 40_000.0}
    out = client.post("/api/update", json={"state": state}).json()
    assert out["simulate"]["requests"]["arrivals"] == 200_000
    assert any("at most 200,000 requests" in n for n in out["notes"])
    assert out["state"]["workload.num_requests"] == 4_000_000
    assert "num_requests = 4000000" in out["toml"]


def test_plotly_is_served_compressed_and_cached(client):
    r = client.get("/vendor/plotly.min.js", headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200
    assert r.headers["content-encoding"] == "gzip"
    assert "max-age" in r.headers["cache-control"]


def test_paging_uses_kv_paging_defaults_and_its_settings_are_checked(client):
    """The page's paged-vs-contiguous replay is `servelab kv paging` with its defaults
    (2,000 requests, the longest sequence the context, no prefix), run in the lab's worker
    process; its settings are editable and checked like any input."""
    from servelab.llm.pool import run_paging

    st = {**default_state(), "llm.context_tokens": 2048}
    got = client.post("/api/paging", json={"state": st}).json()
    want = run_paging(load_scenario("seed").with_overrides({"llm.context_tokens": 2048})
                      ).to_dict()
    assert got["num_requests"] == 2000
    assert got["max_len"] == 2048
    assert got["prefix_tokens"] == 0
    assert [r["mean_concurrency"] for r in got["results"]] == \
        [r["mean_concurrency"] for r in want["results"]]
    small = client.post("/api/paging", json={"state": st, "requests": 300, "max_len": 1024,
                                              "prefix_tokens": 128}).json()
    assert (small["num_requests"], small["max_len"], small["prefix_tokens"]) == (300, 1024, 128)
    assert "paged_prefix" in {r["strategy"] for r in small["results"]}
    for bad, field in [({"requests": 0}, "paging requests"),
                       ({"requests": 10**9}, "paging requests"),
                       ({"max_len": 1}, "paging longest sequence"),
                       ({"prefix_tokens": 5000}, "paging shared prefix")]:
        r = client.post("/api/paging", json={"state": st, **bad})
        assert r.status_code == 400, r.text
        msg = r.json()["error"]
        assert msg.startswith(field)
        assert "fix:" in msg
        assert "\n" not in msg


def test_a_kv_move_reuses_the_simulation(client):
    """Only the closed-form KV figures run when an LLM pool setting moves: the simulation
    and the planner's answers (keyed on the scenario without its pool) are reused."""
    from servelab.lab import server

    st = {**default_state(), "workload.qps": 2345.0}
    client.post("/api/update", json={"state": st})
    before = server._sim_plan.cache_info()
    for dtype in ("fp8", "auto", "fp8_e5m2"):
        d = client.post("/api/update", json={"state": {**st, "llm.kv_dtype": dtype}}).json()
        assert d["simulate"]["scenario"]["llm"]["kv_dtype"] == dtype
    after = server._sim_plan.cache_info()
    assert after.misses == before.misses
    assert after.hits >= before.hits + 3


def test_seed_table_is_plan_seeds(client):
    from servelab.seed import seed_comparison, seed_rows_dict

    s = load_scenario("seed")
    assert client.get("/api/seed").json()["rows"] == seed_rows_dict(
        seed_comparison(s, run_plan(s)))


def test_errors_name_the_scenario_key_not_a_cli_flag(client):
    """The page marks the control an error names; a message in CLI words ("--num-gpus/--tp")
    names none."""
    for extra, key in [({"llm.num_gpus": 3, "llm.tp": 2}, "[llm] num_gpus"),
                       ({"llm.kv_dtype": "fp9"}, "[llm] kv_dtype"),
                       ({"batching.max_batch_size": 0}, "[batching] max_batch_size")]:
        r = client.post("/api/update", json={"state": {**default_state(), **extra}})
        assert r.status_code == 400
        msg = r.json()["error"]
        assert msg.startswith(key), msg
        assert "--" not in msg, msg


def test_a_preview_grows_until_its_p99_is_precise(client):
    """A preview runs 20,000 requests, or 80,000 when the p99's 95% interval is wider than
    2% of it at 20,000; never more than the full run asks for."""
    from servelab.lab.server import PREVIEW_P99_PRECISION, PREVIEW_STEPS

    def preview(state):  # type: ignore[no-untyped-def]
        d = client.post("/api/update", json={"state": state, "preview": True}).json()
        lat = d["simulate"]["latency"]
        lo, hi = lat["p99_interval_ms"]
        return d["simulate"]["requests"]["arrivals"], (hi - lo) / 2 / lat["p99_ms"]

    n, width = preview(default_state())
    assert n in PREVIEW_STEPS
    if n == PREVIEW_STEPS[0]:
        assert width <= PREVIEW_P99_PRECISION
    # exponential service times at a third busy: 20,000 requests cannot pin its p99
    noisy = {**default_state(), "workload.qps": 9000.0, "model.variability": "exponential"}
    n2, _ = preview(noisy)
    assert n2 == PREVIEW_STEPS[1]
    small = {**default_state(), "workload.num_requests": 30_000, "workload.qps": 9000.0,
             "model.variability": "exponential"}
    n3, _ = preview(small)
    assert n3 <= 30_000


def test_the_sidebars_stalls_reach_the_simulation_and_a_rate_alone_is_marked(client):
    state = {**default_state(), "latency.stalls_per_s": 5.0, "latency.stall_ms": 20.0}
    r = client.post("/api/update", json={"state": state})
    assert r.status_code == 200
    plain = client.post("/api/update", json={"state": default_state()}).json()
    assert r.json()["simulate"]["latency"]["p99_ms"] > plain["simulate"]["latency"]["p99_ms"]
    alone = client.post("/api/update", json={"state": {**state, "latency.stall_ms": 0.0}})
    assert alone.status_code == 400
    assert alone.json()["key"] == "latency.stalls_per_s"
    assert "expected a stall length" in alone.json()["error"]
