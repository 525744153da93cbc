"""Materialization and parity, on SQLite and a real Redis: idempotent, incremental,
newer-wins across windows, and parity that catches a stale or wrong online store."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from servelab.errors import ServelabError, StoreError
from servelab.features.definitions import load_repo
from servelab.features.example import generate
from servelab.features.materialization import materialize, parity, to_us
from servelab.features.online import OnlineRow, get_online_features, open_store

T1 = datetime(2024, 5, 10, 12, tzinfo=UTC)
T2 = datetime(2024, 5, 20, 12, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "redis"])
def repo_store(request, tmp_path):  # type: ignore[no-untyped-def]
    generate(tmp_path, users=200, merchants=40, days=30, labels=500)
    repo = load_repo(tmp_path)
    if request.param == "redis":
        cfg = replace(repo.config, redis_url=request.getfixturevalue("redis_url"),
                      name=f"m{time.monotonic_ns()}")
        repo = replace(repo, config=cfg)
    store = open_store(repo, request.param)
    yield repo, store
    store.close()


def test_windows_idempotence_and_parity(repo_store):
    repo, store = repo_store
    first = materialize(repo, store, end=T1)
    assert first.written == 200 + 40
    assert first.skipped_stale == 0
    again = materialize(repo, store, end=T1)  # a re-run writes nothing new
    assert again.written == 0
    assert again.skipped_stale == first.written
    assert parity(repo, store, at=T1).ok
    # Online now lags offline: parity at T2 must say so, by feature.
    stale = parity(repo, store, at=T2)
    assert not stale.ok
    assert stale.mismatches["merchant_risk:risk_score"] > 0
    # Incremental picks up (T1, T2]; then re-running the OLD window changes nothing.
    inc = materialize(repo, store, end=T2, incremental=True)
    assert inc.views[0].start == T1.isoformat()
    assert parity(repo, store, at=T2).ok
    old = materialize(repo, store, end=T1)
    assert old.written == 0
    assert parity(repo, store, at=T2).ok


def test_parity_reports_a_wrong_value(repo_store):
    repo, store = repo_store
    materialize(repo, store, end=T2)
    view = repo.views["merchant_risk"]
    # Someone writes a newer but wrong row for merchant 1 straight into the store.
    store.write(view, [OnlineRow((1,), to_us(T2), 0, {"risk_score": 9.0,
                                                      "chargeback_rate_30d": 0.0,
                                                      "category": "x"})])
    rep = parity(repo, store, at=T2, sample=40)
    assert rep.mismatches["merchant_risk:risk_score"] == 1
    assert rep.examples[0]["key"] == [1]
    assert rep.examples[0]["online"] == 9.0


def test_get_online_features_marks_status(repo_store):
    repo, store = repo_store
    materialize(repo, store, end=T2)
    cols = get_online_features(repo, store, ["user_stats:txn_count_7d", "merchant_risk:category"],
                               {"user_id": [1, 100000], "merchant_id": [1, 2]}, to_us(T2))
    assert cols["txn_count_7d__status"] == ["present", "missing"]
    assert cols["txn_count_7d"][1] is None
    later = get_online_features(repo, store, ["user_stats:txn_count_7d"], {"user_id": [1]},
                                to_us(T2) + 3 * 86_400_000_000)
    assert later["txn_count_7d__status"] == ["expired"]  # two-day TTL


def test_one_entity_row_equals_the_same_row_in_a_batch(repo_store):
    """One entity row takes its own path (a prepared one-key read per view, the result
    built from the row); it must give exactly the batch path's columns for that row:
    present, missing and expired, with full feature names, and the same errors."""
    repo, store = repo_store
    materialize(repo, store, end=T2)
    refs = ["user_stats:txn_count_7d", "user_stats:country", "merchant_risk:category",
            "merchant_risk:risk_score"]
    ents = {"user_id": [1, 100000, 2], "merchant_id": [1, 2, 99999]}
    for now in (to_us(T2), to_us(T2) + 3 * 86_400_000_000):  # the second: user_stats expired
        for full in (False, True):
            batch = get_online_features(repo, store, refs, ents, now, full_feature_names=full)
            for i in range(3):
                one = get_online_features(repo, store, refs,
                                          {k: [v[i]] for k, v in ents.items()}, now,
                                          full_feature_names=full)
                assert list(one) == list(batch)
                assert one == {k: [v[i]] for k, v in batch.items()}
    statuses = {st for k, v in batch.items() if k.endswith("__status") for st in v}
    assert statuses == {"present", "missing", "expired"}
    with pytest.raises(ServelabError, match="merchant_id") as e1:
        get_online_features(repo, store, refs, {"user_id": [1]}, now)
    with pytest.raises(ServelabError, match="merchant_id") as e2:
        get_online_features(repo, store, refs, {"user_id": [1, 2]}, now)
    assert str(e1.value) == str(e2.value)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servelab", "features", *args],
                          capture_output=True, text=True, timeout=300, check=False)


def test_cli_end_to_end(tmp_path):
    repo = tmp_path / "repo"
    assert cli("init", str(repo), "--users", "100", "--merchants", "20", "--days", "10",
               "--labels", "300").returncode == 0
    assert cli("apply", "--repo", str(repo)).returncode == 0
    p = cli("materialize", "--repo", str(repo), "--end", "2024-05-08T00:00:00Z", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["written"] == 120
    p = cli("get-online", "--repo", str(repo), "-f", "user_stats:country", "--entity",
            "user_id=1,2", "--at", "2024-05-08T00:00:00Z", "--json")
    assert json.loads(p.stdout)["country__status"] == ["present", "present"]
    out = tmp_path / "train.parquet"
    p = cli("historical", "--repo", str(repo), "--entities", str(repo / "data/labels.parquet"),
            "-f", "service:fraud_model_v1", "--out", str(out), "--json")
    assert json.loads(p.stdout)["rows"] == 300
    assert out.exists()
    p = cli("parity", "--repo", str(repo), "--json", "--fail-on-mismatch")
    assert p.returncode == 0, p.stdout
    assert json.loads(p.stdout)["ok"]
    scen = tmp_path / "with_fetch.toml"
    p = cli("bench", "--repo", str(repo), "--reads", "50", "--scenario-out", str(scen),
            "--json")
    lat = json.loads(p.stdout)["scenario_latency"]
    assert lat["feature_fetch_p99_ms"] >= lat["feature_fetch_ms"] > 0
    # The measured fetch feeds a serving scenario's latency budget.
    plan = subprocess.run([sys.executable, "-m", "servelab", "simulate", "--scenario",
                           str(scen), "--num-requests", "5000", "--json"],
                          capture_output=True, text=True, timeout=300, check=True)
    fetch = json.loads(plan.stdout)["latency"]["components"]["feature_fetch"]
    assert fetch["p50_ms"] == pytest.approx(round(lat["feature_fetch_ms"], 4), rel=0.05)


def test_cli_errors_are_one_line(tmp_path):
    generate(tmp_path, users=10, merchants=5, days=2, labels=10)
    toml = tmp_path / "feature_repo.toml"
    toml.write_text(toml.read_text().replace('online = "sqlite"', 'online = "redis"').replace(
        "[project]", '[project]\nredis_url = "redis://127.0.0.1:1/0"\nredis_timeout_s = 0.5'))
    for args, needle in [
        (("apply", "--repo", str(tmp_path)), "Redis unreachable"),
        (("apply", "--repo", str(tmp_path / "nope")), "feature_repo.toml"),
        (("get-online", "--repo", str(tmp_path), "-f", "user_stats:txn_cnt_7d", "--entity",
          "user_id=1", "--store", "sqlite"), "did you mean 'txn_count_7d'"),
        (("materialize", "--repo", str(tmp_path), "--end", "yesterday", "--store", "sqlite"),
         "--end = 'yesterday'"),
    ]:
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "servelab", "features", *args],
                           capture_output=True, text=True, timeout=120, check=False)
        assert time.monotonic() - t0 < 60
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
        assert needle in p.stderr, (args, p.stderr)


def test_store_error_type():
    from servelab.features.online.redis import RedisStore

    with pytest.raises(StoreError):
        RedisStore("redis://127.0.0.1:1/0", "p", timeout_s=0.2)


ENTITY_VALUES = st.one_of(st.integers(-5, 300), st.sampled_from(["1", "7", "abc", ""]),
                          st.floats(allow_nan=True), st.none(), st.booleans())


@pytest.fixture(scope="module")
def sqlite_repo(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("fuzz")
    generate(root, users=50, merchants=10, days=10, labels=50)
    repo = load_repo(root)
    store = open_store(repo, "sqlite")
    materialize(repo, store, end=T2)
    yield repo, store
    store.close()


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.dictionaries(st.sampled_from(["user_id", "merchant_id", "other"]),
                    st.lists(ENTITY_VALUES, max_size=3), max_size=3),
    # both keys, one value each per row, mostly keys that exist (users 1-50, merchants 1-10)
    st.integers(0, 4).flatmap(lambda n: st.fixed_dictionaries({
        "user_id": st.lists(st.integers(0, 60), min_size=n, max_size=n),
        "merchant_id": st.lists(st.integers(0, 12), min_size=n, max_size=n)}))),
       st.lists(st.sampled_from(["user_stats:txn_count_7d", "merchant_risk:category",
                                 "service:fraud_model_v1"]), min_size=1, max_size=3),
       st.booleans())
@example({"user_id": [0], "merchant_id": [float("inf")]}, ["merchant_risk:category"], False)
def test_get_online_features_takes_any_entity_columns(sqlite_repo, entities, refs, full):
    """Whatever a caller passes as entity columns: the columns (one value per row, and
    a row read alone equal to the same row in the batch), or one clear error."""
    repo, store = sqlite_repo
    now = to_us(T2)
    try:
        out = get_online_features(repo, store, refs, entities, now, full_feature_names=full)
    except ServelabError as exc:
        message = str(exc)
        out = None
    if out is None:
        assert "\n" not in message
        return
    n = {len(v) for v in entities.values()}.pop()
    assert all(len(col) == n for col in out.values())
    for i in range(n):
        one = get_online_features(repo, store, refs, {k: [v[i]] for k, v in entities.items()},
                                  now, full_feature_names=full)
        assert one == {k: [v[i]] for k, v in out.items()}
