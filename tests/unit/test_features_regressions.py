"""Regression tests for the feature-store bugs found beside Feast (one per bug, on the
real stores: SQLite, a real Redis, DuckDB and a Spark local session)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from servelab.errors import InputError
from servelab.features.definitions import load_repo
from servelab.features.materialization import materialize, parity
from servelab.features.offline import get_historical_features
from servelab.features.online import get_online_features, open_store
from tests.unit.features_data import make_repo


def with_config(root, old: str, new: str) -> None:  # type: ignore[no-untyped-def]
    p = root / "feature_repo.toml"
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new, 1))


# 1. Nothing but JSON on stdout under --json: DuckDB's progress bar is off.
def test_duckdb_progress_bar_is_off(tmp_path):
    import duckdb

    from servelab.features.offline.duckdb import DuckDBEngine

    root, *_ = make_repo(tmp_path)
    repo = load_repo(root)
    for con in (None, duckdb.connect()):
        engine = DuckDBEngine(repo, con)
        assert engine.con.execute(
            "SELECT current_setting('enable_progress_bar')").fetchall() == [(False,)]


# 2. The package's lazily exported names stay the functions.
def test_lazy_exports_are_the_functions_every_time():
    fs = importlib.import_module("servelab.features")
    first = fs.materialize
    importlib.import_module("servelab.features.materialization")
    assert fs.materialize is first
    assert callable(fs.materialize)
    assert fs.materialize is materialize


# 3. One line instead of a traceback.
def test_sub_microsecond_entity_times_are_floored_not_refused(tmp_path):
    root, _, _, ent = make_repo(tmp_path)
    repo = load_repo(root)
    us = ent.copy()
    ns = ent.copy()
    ns["event_timestamp"] = pd.to_datetime(ns["event_timestamp"]).dt.tz_convert("UTC") \
        + pd.Timedelta(nanoseconds=789)
    a = get_historical_features(repo, us, ["service:fraud"])
    b = get_historical_features(repo, ns, ["service:fraud"])
    assert a.drop(["event_timestamp"]).equals(b.drop(["event_timestamp"]))


@pytest.mark.parametrize(("old", "new", "needle"), [
    ('online = "sqlite"', 'online = "sqlite"\nredis_url = "127.0.0.1:6379"',
     "[project] redis_url"),
    ('online = "sqlite"', 'online = "sqlite"\nredis_timeout_s = "2s"',
     "[project] redis_timeout_s"),
    ("ttl_s = 200.0", "ttl_s = true", "ttl_s"),
    ('dtypes = {{ user_id = "int64" }}'.replace("{{", "{").replace("}}", "}"),
     'dtypes = { user_id = "float64" }', "a join key type"),
    ('dtypes = { merchant_id = "string" }', 'dtypes = { merchant_id = "bool" }',
     "a join key type"),
])
def test_bad_definitions_are_one_line(tmp_path, old, new, needle):
    root, *_ = make_repo(tmp_path)
    with_config(root, old, new)
    with pytest.raises(InputError) as err:
        load_repo(root)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)
    assert "fix:" in str(err.value)


def test_historical_checks_its_output_before_the_join(tmp_path):
    root, *_ = make_repo(tmp_path)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "servelab", "features", "historical", "--repo",
                        str(root), "--features", "service:fraud", "--entities",
                        str(tmp_path / "no-such-entities.parquet"), "--out",
                        "/nonexistent_dir/x.parquet"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1
    assert "--out" in r.stderr  # the output is refused first: the entities were never read
    assert time.monotonic() - t0 < 60


# 4. NaN: one rule in both stores and in parity.
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_nan_feature_values_are_no_value_everywhere(tmp_path, kind, request):
    root, users, _, _ = make_repo(tmp_path)
    users.loc[users.index[::3], "avg_amount"] = np.nan
    users.to_parquet(root / "data" / "user_stats.parquet")
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        with_config(root, 'online = "sqlite"', f'online = "redis"\nredis_url = "{url}"')
    repo = load_repo(root)
    store = open_store(repo)
    try:
        store.apply(list(repo.views.values()))
        materialize(repo, store)
        report = parity(repo, store, sample=50)
        assert report.ok, report.examples
        users_with_nan = sorted(set(users.loc[users["avg_amount"].isna(), "user_id"]))
        latest = users.sort_values(["event_ts", "created_ts"]).drop_duplicates(
            "user_id", keep="last").set_index("user_id")  # (groupby.last() skips NaN)
        view = repo.views["user_stats"]
        seen_nan = 0
        for u in users_with_nan:
            at_us = int(pd.Timestamp(latest.loc[u, "event_ts"]).value // 1000)  # within TTL
            [got] = store.read(view, [(int(u),)], ["avg_amount"], at_us)
            assert got.status.value == "present"
            want = latest.loc[u, "avg_amount"]
            if np.isnan(want):
                seen_nan += 1
                assert got.values["avg_amount"] is None  # no value, on every store alike
            else:
                assert got.values["avg_amount"] == want
        assert seen_nan > 0
    finally:
        store.close()


# 5. Float and bool join keys are refused in the definitions (above), so nothing can be
# written under one key form and read under another. Int and string keys round-trip:
def test_int_and_string_keys_round_trip_on_both_stores(tmp_path, request):
    for kind in ("sqlite", "redis"):
        root, *_ = make_repo(tmp_path / kind)
        if kind == "redis":
            url = request.getfixturevalue("redis_url")
            with_config(root, 'online = "sqlite"', f'online = "redis"\nredis_url = "{url}"')
        repo = load_repo(root)
        store = open_store(repo)
        try:
            store.apply(list(repo.views.values()))
            materialize(repo, store)
            got = get_online_features(repo, store, ["service:fraud"],
                                      {"user_id": [1, 2], "merchant_id": ["m1", "m2"]},
                                      int(time.time() * 1e6))
            # found under the key it was written with (the TTL may have expired it since)
            assert "missing" not in got["txn_count__status"]
            assert "missing" not in got["risk__status"]
        finally:
            store.close()


# Also: one engine contract for a source that lacks a declared (unrequested) feature.
@pytest.mark.parametrize("engine", ["duckdb", pytest.param("spark", marks=pytest.mark.spark)])
def test_a_source_missing_a_declared_feature_is_refused_by_every_engine(tmp_path, engine):
    root, users, _, ent = make_repo(tmp_path)
    users.drop(columns=["avg_amount"]).to_parquet(root / "data" / "user_stats.parquet")
    repo = load_repo(root)
    with pytest.raises(InputError) as err:
        get_historical_features(repo, ent, ["user_stats:txn_count"], engine=engine)
    assert "avg_amount" in str(err.value)


def test_historical_json_is_only_json(tmp_path):
    root, _, _, ent = make_repo(tmp_path)
    ent.to_parquet(tmp_path / "ent.parquet")
    r = subprocess.run([sys.executable, "-m", "servelab", "features", "historical", "--repo",
                        str(root), "--features", "service:fraud", "--entities",
                        str(tmp_path / "ent.parquet"), "--json"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)
