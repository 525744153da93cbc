"""Join keys typed once (features/keys.py): the offline join, the online read on SQLite
and on a real Redis, and the gateway's join over the same entity rows give the same
values, or refuse the same rows with one line."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servelab.errors import InputError
from servelab.features.definitions import load_repo
from servelab.features.keys import typed_key
from servelab.features.materialization import materialize, to_us
from servelab.features.offline import get_historical_features
from servelab.features.online import get_online_features, open_store
from servelab.gateway.join import FeatureJoin
from tests.unit.features_data import BASE, make_repo

FEATURES = ["user_stats:txn_count", "user_stats:avg_amount", "merchant_risk:risk"]
# After every event (0-1000 s after BASE) with the user TTL of 200 s: some users' latest
# values are present, some expired, ids past 20 were never written.
NOW = BASE + pd.Timedelta(seconds=1100)


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def world(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    root, users, _, _ = make_repo(tmp_path_factory.mktemp(request.param))
    users.loc[users.index[::4], "avg_amount"] = np.nan  # NaN: no value, on every path
    users.to_parquet(root / "data" / "user_stats.parquet")
    # its own project: the session's Redis is shared, and the same rows written under
    # another test's project name would be skipped as the same version
    toml = (root / "feature_repo.toml").read_text().replace('name = "contract"',
                                                            'name = "contract_keys"')
    assert "contract_keys" in toml
    toml += '\n[services.users]\nfeatures = ["user_stats:txn_count", "user_stats:avg_amount"]\n'
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        toml = toml.replace('online = "sqlite"', f'online = "redis"\nredis_url = "{url}"')
    (root / "feature_repo.toml").write_text(toml)
    repo = load_repo(root)
    store = open_store(repo)
    store.apply(list(repo.views.values()))
    materialize(repo, store, end=NOW.tz_localize("UTC").to_pydatetime())
    yield repo, store
    store.close()


user_ids = st.one_of(st.integers(0, 25), st.integers(0, 25).map(float),
                     st.floats(0, 25).filter(lambda v: not float(v).is_integer()),
                     st.booleans(), st.integers(0, 25).map(str), st.sampled_from(["x", ""]))
merchants = st.one_of(st.sampled_from(["m1", "m2", "m3", "m9"]), st.integers(1, 3))


def valid(v: object) -> bool:
    try:
        typed_key("user_id", "int64", v)
    except InputError:
        return False
    return True


def outcome(fn):  # type: ignore[no-untyped-def]
    """What a read returned, or the InputError it raised."""
    try:
        return fn()
    except InputError as exc:
        return exc


def same(a: object, b: object) -> bool:
    def none(v: object) -> bool:
        return v is None or (isinstance(v, float) and math.isnan(v))
    return (none(a) and none(b)) or a == b


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(user_ids, merchants), min_size=1, max_size=6))
def test_offline_and_online_read_the_same_keys_the_same_way(world, rows):
    repo, store = world
    users = [u for u, _ in rows]
    ms = [m for _, m in rows]
    now_us = to_us(NOW.tz_localize("UTC").to_pydatetime())
    user_col = (pa.array(users, pa.float64()) if all(isinstance(u, float) for u in users)
                else pa.array(users) if len({type(u) for u in users}) == 1
                else pa.array([str(u) for u in users]))  # a mixed column is text
    entity = pa.table({"user_id": user_col, "merchant_id": pa.array([str(m) for m in ms]),
                       "event_timestamp": pa.array([NOW] * len(rows), pa.timestamp("us"))})
    typed = [type(u) for u in users]
    offline_ok = all(valid(u) for u in user_col.to_pylist())
    online_ok = all(valid(u) for u in users)
    off = outcome(lambda: get_historical_features(repo, entity, FEATURES).to_pylist())
    on = outcome(lambda: get_online_features(
        repo, store, FEATURES, {"user_id": users, "merchant_id": [str(m) for m in ms]},
        now_us))
    for got, ok in ((off, offline_ok), (on, online_ok)):
        if isinstance(got, InputError):  # refused: both paths by the one rule, in one line
            assert not ok, got
            assert "user_id" in str(got)
            assert "fix:" in str(got)
        else:
            assert ok, (users, typed)
    if isinstance(off, InputError) or isinstance(on, InputError):
        return
    for i, row in enumerate(off):
        for f in ("txn_count", "avg_amount", "risk"):
            assert same(row[f], on[f][i]), (f, users[i], ms[i], row[f], on[f][i])
            if on[f"{f}__status"][i] != "present":
                assert row[f] is None
    # The gateway's join over the same whole-number keys serves the same values.
    join = FeatureJoin(repo, "users", clock_us=lambda: now_us)
    try:
        keys = [typed_key("user_id", "int64", u) for u in users]
        got = join.join([{"user_id": np.array([[k]], np.int64)} for k in keys])
    finally:
        join.close()
    for i, served in enumerate(got.values):
        for f in ("txn_count", "avg_amount"):
            assert same(served[0][f], off[i][f]), (f, users[i], served[0][f], off[i][f])


def test_a_nan_is_null_in_a_training_set_too(world):
    repo, _ = world
    entity = pa.table({"user_id": pa.array(list(range(1, 21)), pa.int64()),
                       "event_timestamp": pa.array([NOW] * 20, pa.timestamp("us"))})
    out = get_historical_features(repo, entity, ["user_stats:avg_amount"])
    values = out.column("avg_amount").to_pylist()
    assert not any(isinstance(v, float) and math.isnan(v) for v in values)


def test_empty_entity_times_and_a_string_for_a_list_are_one_line(world, tmp_path):
    repo, _ = world
    entity = pd.DataFrame({"user_id": [1, 2], "event_timestamp": [NOW, pd.NaT]})
    with pytest.raises(InputError, match=r"1 empty .NaT or null. times, the first in row 1"):
        get_historical_features(repo, entity, ["user_stats:txn_count"])
    root = tmp_path / "r"
    make_repo(root)
    toml = (root / "feature_repo.toml").read_text()
    (root / "feature_repo.toml").write_text(toml.replace('entities = ["user"]',
                                                         'entities = "user"', 1))
    with pytest.raises(InputError, match=r'entities = .user.: expected a list of entity '
                                         r'names; fix: write entities = \["user"\]'):
        load_repo(root)


@pytest.mark.parametrize(("value", "ok"), [
    (2, True), (np.int32(2), True), (2.0, True), ("2", True), (2.9, False), (True, False),
    (np.bool_(True), False), (float("nan"), False), (2**63, False), (None, False)])
def test_a_key_value_is_taken_only_as_a_whole_number(value, ok):
    if ok:
        assert typed_key("user_id", "int64", value) == 2
    else:
        with pytest.raises(InputError, match="user_id"):
            typed_key("user_id", "int64", value)
