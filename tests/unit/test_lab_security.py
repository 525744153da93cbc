"""The lab as a hostile page would use it: paths in the state, a foreign Host, oversized
bodies and scenarios, malformed JSON. Every answer is one JSON line with a 4xx, and no
file is opened unless it sits inside the folder the lab was started with."""

from __future__ import annotations

import builtins
import io
import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servelab.lab.server import LAB_MAX_REQUESTS, LabConfig, create_app, default_state
from tests.services import bounded_work

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

SECRET = "TOP-SECRET-LINE"


def client_for(config: LabConfig | None = None, host: str = "127.0.0.1") -> TestClient:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TestClient(create_app(config), base_url=f"http://{host}")


@pytest.fixture(scope="module")
def client() -> TestClient:
    return client_for()


@pytest.fixture
def secret_files(tmp_path: Path) -> dict[str, Path]:
    """Files a page must not be able to read: a CSV, a config.json, a TOML."""
    out = {}
    for name, text in (("trace.csv", f"arrival_s\n{SECRET}\n"),
                       ("config.json", json.dumps({"name": SECRET, "num_hidden_layers": 2,
                                                   "num_attention_heads": 4,
                                                   "hidden_size": 64})),
                       ("profile.csv", f"batch_size,latency_ms\n1,{SECRET}\n")):
        p = tmp_path / "outside" / name
        p.parent.mkdir(exist_ok=True)
        p.write_text(text)
        out[name] = p
    return out


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path the process opens or stats while the test runs."""
    seen: list[str] = []
    real_open, real_io_open, real_stat, real_os_open = builtins.open, io.open, os.stat, os.open

    def spy(real: Any) -> Any:
        def wrapped(path: Any, *a: Any, **k: Any) -> Any:
            seen.append(os.fsdecode(path) if isinstance(path, str | bytes | os.PathLike)
                        else str(path))
            return real(path, *a, **k)
        return wrapped

    monkeypatch.setattr(builtins, "open", spy(real_open))
    monkeypatch.setattr(io, "open", spy(real_io_open))
    monkeypatch.setattr(os, "stat", spy(real_stat))
    monkeypatch.setattr(os, "open", spy(real_os_open))
    return seen


def state(**over: Any) -> dict[str, Any]:
    s = default_state()
    s["workload.num_requests"] = 5_000
    s.update(over)
    return s


def assert_json_error(r: Any, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json")
    msg = r.json()["error"]
    assert "\n" not in msg
    assert 0 < len(msg) < 500
    return str(msg)


# ---------------------------------------------------------------------------
# 1. No file the user did not give


@pytest.mark.parametrize(("key", "file"), [
    ("workload.trace_csv", "trace.csv"),
    ("model.csv", "profile.csv"),
    ("llm.model", "config.json"),
])
def test_a_path_in_the_state_is_refused_without_reading_it(client, secret_files, opened,
                                                           key, file):
    path = str(secret_files[file])
    extra: dict[str, Any] = {key: path}
    if key == "workload.trace_csv":
        extra["workload.arrival"] = "trace"
    if key == "model.csv":
        extra["model.kind"] = "profile"
    # The routes that use the key: the sweeps never read [llm], the replay reads only it.
    routes = ("/api/update", "/api/paging") if key == "llm.model" else (
        "/api/update", "/api/charts")
    for route in routes:
        r = client.post(route, json={"state": state(**extra)})
        msg = assert_json_error(r, 400)
        assert SECRET not in r.text
        assert "does not open files" in msg
        assert "--data-dir" in msg
    assert not [p for p in opened if str(secret_files[file].parent) in p], opened


def test_perf_analyzer_paths_and_parse_are_refused(client, secret_files, opened):
    toml = (f'[model]\nkind = "profile"\nperf_analyzer_csv = {{ "1" = '
            f'"{secret_files["profile.csv"]}" }}\n')
    msg = assert_json_error(client.post("/api/parse", json={"toml": toml}), 400)
    assert "perf_analyzer_csv" in msg
    assert SECRET not in msg
    toml = f'[workload]\narrival = "trace"\ntrace_csv = "{secret_files["trace.csv"]}"\n'
    assert "does not open files" in assert_json_error(
        client.post("/api/parse", json={"toml": toml}), 400)
    assert not [p for p in opened if "outside" in p], opened


def test_data_dir_allows_its_own_files_and_nothing_outside(tmp_path, secret_files):
    data = tmp_path / "data"
    data.mkdir()
    (data / "arrivals.csv").write_text("arrival_s\n" + "\n".join(
        str(i * 0.001) for i in range(2000)) + "\n")
    (data / "escape.csv").symlink_to(secret_files["trace.csv"])
    c = client_for(LabConfig(data_dir=str(data)))
    ok = c.post("/api/update", json={"state": state(**{
        "workload.arrival": "trace", "workload.trace_csv": "arrivals.csv"})})
    assert ok.status_code == 200, ok.text[:300]
    assert ok.json()["simulate"]["requests"]["arrivals"] == 2000
    for bad, needle in (("../outside/trace.csv", "inside the lab's --data-dir"),
                        (str(secret_files["trace.csv"]), "inside the lab's --data-dir"),
                        ("escape.csv", "leads outside")):
        r = c.post("/api/update", json={"state": state(**{
            "workload.arrival": "trace", "workload.trace_csv": bad})})
        assert needle in assert_json_error(r, 400)
        assert SECRET not in r.text


def test_inline_data_works_where_a_path_would_not(client):
    arrivals = [round(i * 0.0005, 6) for i in range(3000)]
    r = client.post("/api/update", json={"state": state(**{
        "workload.arrival": "trace", "workload.arrivals_s": arrivals})})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["simulate"]["requests"]["arrivals"] == 3000
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
           "num_parameters": 1e6}
    r = client.post("/api/update", json={"state": state(**{"llm.config": cfg})})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["kv"]["model"]["num_layers"] == 2
    assert r.json()["kv"]["kv"]["bytes_per_token"] == 2 * 2 * 4 * 16 * 2  # K,V x L x H x D x 2B


def test_a_profile_scenario_loads_and_runs(client):
    toml = ('name = "p"\n[model]\nkind = "profile"\npoints = [[1, 0.9], [8, 1.6], [32, 3.5]]\n'
            "[workload]\nnum_requests = 3000\n")
    r = client.post("/api/parse", json={"toml": toml})
    assert r.status_code == 200, r.text
    st_ = r.json()["state"]
    assert st_["model.points"] == [[1, 0.9], [8, 1.6], [32, 3.5]]
    u = client.post("/api/update", json={"state": st_})
    assert u.status_code == 200, u.text[:300]
    assert u.json()["simulate"]["gpu"]["batch_costs"][0]["exec_ms"] == pytest.approx(0.9)


# ---------------------------------------------------------------------------
# 2. DNS rebinding: only the hosts the lab was started for


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example",
                                  "", "localhost.", "[::2]:80"])
def test_a_foreign_host_gets_403(client, host):
    for method, path in (("get", "/"), ("get", "/api/meta"), ("post", "/api/update")):
        r = getattr(client, method)(path, headers={"host": host},
                                    **({"json": {"state": state()}} if method == "post" else {}))
        assert "answers only" in assert_json_error(r, 403)


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "[::1]:8000", "LOCALHOST"])
def test_loopback_names_are_answered(client, host):
    assert client.get("/api/meta", headers={"host": host}).status_code == 200


def test_allowed_hosts_are_configurable():
    c = client_for(LabConfig(allowed_hosts=("lab.internal",)), host="lab.internal")
    assert c.get("/api/meta").status_code == 200
    assert c.get("/api/meta", headers={"host": "127.0.0.1"}).status_code == 403


# ---------------------------------------------------------------------------
# 3. Bounded work per request


def test_huge_scenarios_are_capped_fast_and_say_so(client):
    with bounded_work(30):  # capped: seconds, not the hour it took uncapped
        r = client.post("/api/update", json={"state": state(**{
            "workload.num_requests": 5_000_000, "hardware.num_gpus": 100_000,
            "batching.instances_per_gpu": 64, "plan.max_gpus": 100_000})})
    assert r.status_code == 200, r.text[:300]
    d = r.json()
    assert d["simulate"]["requests"]["arrivals"] == LAB_MAX_REQUESTS
    assert any("at most 200,000 requests" in n for n in d["notes"])
    assert any("GPUs" in n for n in d["notes"])


def test_paging_of_a_huge_pool_is_capped(client):
    with bounded_work(60):
        r = client.post("/api/paging", json={"state": state(**{
            "llm.num_gpus": 1024, "llm.tp": 0, "llm.model": "llama-3.1-8b"})})
    if r.status_code == 200:
        assert any("capped" in n for n in r.json()["notes"])
    else:
        assert_json_error(r, 400)


def test_oversized_body_is_413(client):
    big = {"state": {"name": "x" * (5 * 1024 * 1024)}}
    assert "bytes" in assert_json_error(client.post("/api/update", json=big), 413)


# ---------------------------------------------------------------------------
# 4. Every error is one JSON line with a 4xx


@pytest.mark.parametrize("body", [
    {"state": {"workload.qps": [[1, 2], [3]]}},
    {"state": {"workload.qps": 10**400}},
    {"state": {"workload.num_requests": 10**400}},
    {"state": {"workload.arrival": "gamma", "workload.cv": 1e-300}},
    {"state": {"workload": 5, "workload.qps": 3}},
    {"state": {"llm.config": {"num_hidden_layers": 10**30}}},
    {"state": {"batching.preferred_batch_size": list(range(1, 70_000))}},
    {"state": {"model.kind": "profile", "model.points": [[1, "x"]]}},
    {"state": {"hardware.gpu": {"a": [1, {"b": None}]}}},
    {"state": []},
    {"nope": 1},
    {"state": {"workload.qps": -1}},
])
def test_bad_bodies_are_400_json(client, body):
    uses_llm = any(str(k).startswith("llm.") for k in body.get("state") or {})
    for route in ("/api/update", "/api/paging" if uses_llm else "/api/charts"):
        assert_json_error(client.post(route, json=body), 400)


def test_malformed_json_and_toml_are_400(client):
    r = client.post("/api/update", content=b"{not json", headers={"content-type":
                                                                  "application/json"})
    assert_json_error(r, 400)
    deep = "a = " + "[" * 5000 + "]" * 5000
    for toml in ("[workload\nqps=1", deep, "[workload.qps]\nx = 1", "a = 1" + "0" * 5000,
                 "[[batching]]\nmax_batch_size = 4"):
        assert_json_error(client.post("/api/parse", json={"toml": toml}), 400)


def test_unknown_route_and_method_are_json(client):
    assert_json_error(client.get("/api/nope"), 404)
    assert_json_error(client.get("/api/update"), 405)


# ---------------------------------------------------------------------------
# Fuzz: generated bodies on every route


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**25), 10**25),
                         st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=16),
                         st.sampled_from(["/etc/passwd", "../x.csv", "trace", "profile",
                                          "gamma", "H100", "fp8", "llama-3.1-8b"]))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)
KEYS = ["workload.qps", "workload.arrival", "workload.cv", "workload.trace_csv",
        "workload.arrivals_s", "workload.num_requests", "batching.max_batch_size",
        "batching.max_queue_delay_microseconds", "batching.preferred_batch_size",
        "batching.default_timeout_microseconds", "batching.instances_per_gpu",
        "hardware.gpu", "hardware.num_gpus", "model.kind", "model.points", "model.csv",
        "model.latency_ms", "model.cv", "model.variability", "latency.network_ms",
        "latency.network_p99_ms", "llm.model", "llm.config", "llm.context_tokens",
        "llm.num_gpus", "llm.tp", "llm.kv_dtype", "plan.max_gpus", "name", "bogus.key",
        "workload", "llm.request_rate", "llm.enable_prefix_caching", "llm.step_profile_csv"]


@settings(max_examples=int(os.environ.get("SERVELAB_FUZZ_EXAMPLES", "80")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(over=st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4),
       route=st.sampled_from(["/api/update", "/api/charts", "/api/paging"]))
def test_generated_bodies(client, over, route):
    s = state()
    s["workload.num_requests"] = 3000
    s.update(over)
    with bounded_work(20):
        r = client.post(route, json={"state": s})
    assert r.status_code in (200, 400), (r.status_code, over, r.text[:300])
    if r.status_code == 400:
        assert_json_error(r, 400)


@settings(max_examples=int(os.environ.get("SERVELAB_FUZZ_EXAMPLES", "80")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(extra=st.fixed_dictionaries({}, optional={
    "requests": json_values, "max_len": json_values, "prefix_tokens": json_values,
    "preview": json_values}))
def test_generated_paging_settings_and_preview(client, extra):
    """The replay's settings and the preview flag, whatever a page sends: an answer or one
    JSON line, in bounded time (the lab caps the replay at 5,000 requests)."""
    s = state(**{"llm.context_tokens": 512})
    for route in ("/api/paging", "/api/update"):
        with bounded_work(30):
            r = client.post(route, json={"state": s, **extra})
        assert r.status_code in (200, 400), (r.status_code, extra, r.text[:300])
        if r.status_code == 400:
            assert_json_error(r, 400)


@settings(max_examples=int(os.environ.get("SERVELAB_FUZZ_EXAMPLES", "80")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(max_size=200), st.sampled_from([
    "[workload]\nqps = 1e-300", "[model]\nkind='profile'\ncsv='/etc/passwd'",
    "[llm]\nmodel = '/etc/hosts.json'", "[llm.config]\nnum_hidden_layers = 'x'",
    "name = 5", "[batching]\npreferred_batch_size = [0]"])))
def test_generated_toml(client, text):
    r = client.post("/api/parse", json={"toml": text})
    assert r.status_code in (200, 400), (r.status_code, text, r.text[:300])
    if r.status_code == 400:
        assert_json_error(r, 400)


lab_values = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                      st.text(max_size=30), st.booleans(), st.lists(st.integers(), max_size=2))


@settings(max_examples=int(os.environ.get("SERVELAB_FUZZ_EXAMPLES", "80")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lab=st.dictionaries(
    st.sampled_from(["drift", "paging", "Drift", "other"]),
    st.one_of(lab_values, st.dictionaries(
        st.sampled_from(["feature", "mean_shift", "spread", "missing", "new_category", "rows",
                         "requests", "max_len", "prefix_tokens", "rowz"]),
        st.one_of(lab_values, st.sampled_from(["country", "avg_amount_7d"])), max_size=4)),
    max_size=3))
def test_generated_lab_tables(client, lab):
    """Load TOML's [lab] tables (the drift and paging sections): any value is taken within
    its range or refused in one line that names the key."""
    import tomli_w

    try:
        text = 'name = "x"\n' + tomli_w.dumps({"lab": lab})
    except (TypeError, ValueError):
        return  # not TOML (a NaN is; nested None is not)
    r = client.post("/api/parse", json={"toml": text})
    assert r.status_code in (200, 400), (r.status_code, text, r.text[:300])
    if r.status_code == 400:
        assert_json_error(r, 400)
        assert "[lab" in r.json()["error"], r.text
    else:
        assert set(r.json()["lab"]) == set(lab)


# ---------------------------------------------------------------------------
# The drift section's endpoint: any body is a 200 or one JSON line with a 400


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(
    st.fixed_dictionaries({}, optional={
        "feature": st.one_of(st.sampled_from(["avg_amount_7d", "country", "risk_score"]),
                             st.text(max_size=120)),
        "mean_shift": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(),
                              st.text(max_size=5)),
        "spread": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.none()),
        "missing": st.floats(-1, 2),
        "new_category": st.floats(-1, 2),
        "rows": st.one_of(st.integers(-10, 10**9),
                          st.floats(allow_nan=False, allow_infinity=False)),
        "seed": st.integers(-5, 2**40)}),
    st.lists(st.integers(), max_size=3), st.text(max_size=20)))
def test_drift_endpoint_takes_any_body(client, body):
    r = client.post("/api/drift", json=body)
    if r.status_code == 200:
        d = r.json()
        assert d["psi"] >= 0
        assert d["status"] in ("ok", "warn", "alert")
        assert 20 <= d["n_current"] <= 100_000
    else:
        assert_json_error(r, 400)


def test_drift_meta_names_the_example_features_and_parity(client):
    r = client.get("/api/drift/meta")
    assert r.status_code == 200
    d = r.json()
    assert {f["name"] for f in d["features"]} >= {"avg_amount_7d", "risk_score", "country"}
    assert d["parity"]["ok"] is True
    assert d["parity"]["rows_checked"] > 0


# The LLM section's state: the seed's, over an 8B pool on one GPU (the seed's 70B pool
# saturates near 0.75 requests/s), as the page would send it.
LIGHT = {"llm.model": "llama-3.1-8b", "llm.num_gpus": 1, "llm.tp": 1, "llm.kv_dtype": "auto",
         "llm.weight_dtype": "auto", "llm.gpu_memory_gb": None, "llm.weights_gb": None}


def llm_state(**keys: object) -> dict:  # type: ignore[type-arg]
    from servelab.lab.server import default_state

    return {**default_state(), **LIGHT, **keys}


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(llm=st.fixed_dictionaries({}, optional={
    "llm.model": st.one_of(st.sampled_from(["llama-3.1-8b", "../../etc/passwd", "/etc/hosts"]),
                           st.text(max_size=20)),
    "llm.gpu": st.one_of(st.sampled_from(["H100-SXM", "A100-40GB"]), st.text(max_size=10)),
    "llm.kv_dtype": st.sampled_from(["auto", "fp8", "bogus"]),
    "llm.tp": st.integers(-2, 100), "llm.num_gpus": st.integers(-1, 2000),
    "llm.pp": st.integers(-1, 100),
    "llm.request_rate": st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                                  st.integers(-5, 20_000)),
    "llm.num_requests": st.integers(-1, 10**9),
    "llm.prompt_tokens": st.integers(-1, 400_000), "llm.output_tokens": st.integers(-1, 100_000),
    "llm.prompt_tokens_p99": st.integers(-1, 400_000),
    "llm.max_num_seqs": st.integers(0, 5_000),
    "llm.max_num_batched_tokens": st.integers(0, 200_000),
    "llm.max_concurrency": st.integers(-1, 100_000), "llm.burstiness": st.floats(-1, 100),
    "llm.lengths_csv": st.sampled_from(["/etc/passwd", "x.csv"]),
    "llm.step_profile_csv": st.sampled_from(["/etc/hosts", "steps.csv"])}),
    extra=st.fixed_dictionaries({}, optional={
        "preview": st.one_of(st.booleans(), st.text(max_size=3)),
        "model": st.text(max_size=5),  # a field the section does not take
        "sweep": st.booleans(),
        "fitted": st.one_of(st.none(), st.text(max_size=5), st.fixed_dictionaries(
            {k: st.floats(-1, 2e5, allow_nan=False) for k in (
                "base_ms", "per_prefill_token_ms", "per_decode_seq_ms", "per_kv_token_ms")},
            optional={"overhead_ms": st.floats(-1, 1e6, allow_nan=False),
                      "num_blocks": st.integers(-1, 20_000_000),
                      "label": st.text(max_size=300),
                      "rule": st.sampled_from(["vllm-v1", "llama.cpp", "tgi", ""]),
                      "ctx_per_slot": st.integers(-1, 20_000_000)}))}))
def test_llm_endpoint_takes_any_body_in_bounded_time(client, opened, llm, extra):
    with bounded_work(20):
        r = client.post("/api/llm", json={"state": llm_state(**llm), **extra})
    if r.status_code == 200:
        d = r.json()
        if extra.get("sweep"):
            assert len(d["sweep"]) == 6
        else:
            assert d["requests"]["served"] + d["requests"]["rejected"] == (
                d["requests"]["arrived"])
            assert d["requests_simulated"] <= 2_000
    else:
        assert_json_error(r, 400)
    assert not [p for p in opened if "passwd" in p or p.endswith("hosts")]


def test_llm_model_names_only_never_a_path(client, opened):
    for name in ("/etc/hosts", "../../../etc/passwd", "config.json"):
        r = client.post("/api/llm", json={"state": llm_state(**{"llm.model": name})})
        assert "model" in assert_json_error(r, 400)
    assert not [p for p in opened if "passwd" in p or p.endswith("hosts") or
                p.endswith("config.json")]


def test_llm_endpoint_runs_a_validated_servers_fit(client):
    """The page sends llm validate's fit; the section's figures are the simulator's on
    that step model and pool, with the time outside the steps added to TTFT, as validate
    adds it."""
    from servelab.lab.llm_lab import LlmFit, run
    from servelab.lab.server import _scenario

    fit = {"base_ms": 9.5, "per_prefill_token_ms": 1.14, "per_decode_seq_ms": 1.6,
           "per_kv_token_ms": 0.0077, "overhead_ms": 6.0, "num_blocks": 256, "label": "x"}
    state = llm_state(**{"llm.request_rate": 1.0, "llm.prompt_tokens": 128,
                         "llm.output_tokens": 32, "llm.max_num_seqs": 4,
                         "llm.max_num_batched_tokens": 2048})
    fitted = client.post("/api/llm", json={"state": state, "fitted": fit}).json()
    plain = run(_scenario(state, None), LlmFit(**{**fit, "overhead_ms": 0.0}))
    assert fitted["ttft_ms"]["p50"] == pytest.approx(plain["ttft_ms"]["p50"] + 6.0)
    assert fitted["tpot_ms"]["p50"] == pytest.approx(plain["tpot_ms"]["p50"])
    assert fitted["num_blocks_per_replica"] == 256
    assert fitted["step_model"]["kind"] == "profile"
    roofline = client.post("/api/llm", json={"state": state}).json()
    assert roofline["step_model"]["kind"] != "profile"
    bad = client.post("/api/llm", json={"state": state, "fitted": {**fit, "base_ms": -1}})
    assert "base_ms" in assert_json_error(bad, 400)
    # a llama.cpp server's fit runs its own rule: slots, and ubatches each a pass
    llama = {**fit, "rule": "llama.cpp", "ctx_per_slot": 1024}
    ll = client.post("/api/llm", json={"state": state, "fitted": llama}).json()
    assert ll["tpot_ms"]["p50"] > fitted["tpot_ms"]["p50"]
    bad = client.post("/api/llm", json={"state": state, "fitted": {**fit, "rule": "tgi"}})
    assert "rule" in assert_json_error(bad, 400)


def test_an_llm_preview_is_smaller_says_so_and_leaves_the_sweep(client):
    body = {"state": llm_state(**{"llm.request_rate": 5.0})}
    full = client.post("/api/llm", json=body).json()
    prev = client.post("/api/llm", json={**body, "preview": True}).json()
    assert full["preview"] is False
    assert "sweep" not in full  # the chart's sweep is a request of its own
    assert len(client.post("/api/llm", json={**body, "sweep": True}).json()["sweep"]) == 6
    assert prev["preview"] is True
    from servelab.lab.llm_lab import PREVIEW_SHARE

    assert prev["requests_simulated"] == full["requests_simulated"] // PREVIEW_SHARE
    assert prev["requests"]["arrived"] == prev["requests_simulated"]
    assert any(n.startswith("preview while the slider moves") for n in prev["notes"])
