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
    assert d["simulate"] == run_simulate(seed).to_dict()
    assert d["plan"]["num_gpus"] == run_plan(seed).plan.num_gpus
    assert d["kv"]["kv"]["bytes_per_token"] == 327_680
    assert d["toml"].startswith('name = "seed"')


def test_bad_state_is_a_400_with_the_scenario_message(client):
    state = {**default_state(), "batching.max_batch_size": 0}
    r = client.post("/api/update", json={"state": state})
    assert r.status_code == 400
    assert r.json()["error"].startswith("[batching] max_batch_size = 0: expected")


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


def test_plotly_is_served_compressed_and_cached(client):
    r = client.get("/vendor/plotly.min.js", headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200
    assert r.headers["content-encoding"] == "gzip"
    assert "max-age" in r.headers["cache-control"]
