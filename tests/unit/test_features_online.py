"""One online-store contract on SQLite and a real Redis server."""

from __future__ import annotations

import time

import pytest

from servelab.errors import StoreError
from servelab.features.definitions import load_repo
from servelab.features.online import OnlineRow, Status, open_store
from tests.unit.features_data import make_repo

S = 1_000_000  # us


@pytest.fixture(params=["sqlite", "redis"])
def store_and_view(request, tmp_path):  # type: ignore[no-untyped-def]
    root, *_ = make_repo(tmp_path, 0, n_entities=80)
    repo = load_repo(root)
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        repo = type(repo)(config=type(repo.config)(**{**{f: getattr(repo.config, f) for f in
                                                          repo.config.__slots__},
                                                       "redis_url": url,
                                                       "name": f"t{time.monotonic_ns()}"}),
                          entities=repo.entities, views=repo.views, services=repo.services)
    store = open_store(repo, request.param)
    store.apply(list(repo.views.values()))
    yield store, repo.views["user_stats"], repo.views["merchant_risk"]
    store.close()


def row(key, ts_s, cr_s, count, amount):  # type: ignore[no-untyped-def]
    return OnlineRow((key,), ts_s * S, cr_s * S, {"txn_count": count, "avg_amount": amount})


def test_write_newer_wins(store_and_view):
    store, view, _ = store_and_view
    assert store.write(view, [row(1, 100, 100, 5, 1.5), row(2, 100, 100, 7, 2.5)]) == (2, 0)
    # An older event, the same version again, an older created time: all stale.
    assert store.write(view, [row(1, 50, 200, 1, 0.1), row(1, 100, 100, 9, 9.9),
                              row(2, 100, 99, 0, 0.0)]) == (0, 3)
    # A later created time at the same event time, and a later event: written.
    assert store.write(view, [row(1, 100, 101, 6, 1.25), row(2, 120, 0, 8, 3.75)]) == (2, 0)
    got = store.read(view, [(1,), (2,)], ["txn_count", "avg_amount"], now_us=130 * S)
    assert [g.values for g in got] == [{"txn_count": 6, "avg_amount": 1.25},
                                       {"txn_count": 8, "avg_amount": 3.75}]
    assert all(g.status is Status.PRESENT for g in got)


def test_ttl_on_read_and_missing(store_and_view):
    store, view, _ = store_and_view  # user_stats has ttl_s = 200
    store.write(view, [row(1, 1000, 1000, 3, 1.0)])
    keys = [(1,), (42,), (1,)]
    at_edge = store.read(view, keys, ["txn_count"], now_us=1200 * S)
    assert [g.status for g in at_edge] == [Status.PRESENT, Status.MISSING, Status.PRESENT]
    assert at_edge[0].values == {"txn_count": 3}
    late = store.read(view, keys, ["txn_count"], now_us=1200 * S + 1)
    assert late[0].status is Status.EXPIRED
    assert late[0].values == {"txn_count": None}
    assert late[1].values == {"txn_count": None}


def test_strings_nulls_and_no_ttl(store_and_view):
    store, _, merchants = store_and_view  # merchant_risk: string key, no TTL
    store.write(merchants, [OnlineRow(("m1",), 5 * S, 0, {"risk": 0.25, "category": "c1"}),
                            OnlineRow(("m2",), 5 * S, 0, {"risk": None, "category": ""})])
    got = store.read(merchants, [("m1",), ("m2",)], ["risk", "category"], now_us=10**15)
    assert got[0].values == {"risk": 0.25, "category": "c1"}
    assert got[1].values == {"risk": None, "category": ""}
    assert got[1].status is Status.PRESENT


def test_meta(store_and_view):
    store, *_ = store_and_view
    assert store.get_meta("x") is None
    store.set_meta("x", "2024-01-01T00:00:00+00:00")
    assert store.get_meta("x") == "2024-01-01T00:00:00+00:00"


def test_unreachable_redis_is_a_clear_error_not_a_hang():
    from servelab.features.online.redis import RedisStore

    t0 = time.monotonic()
    with pytest.raises(StoreError, match=r"Redis unreachable.*fix: start redis-server"):
        RedisStore("redis://127.0.0.1:1/0", "p", timeout_s=0.5)
    assert time.monotonic() - t0 < 5


def test_one_key_reads_equal_batch_reads(store_and_view):
    """Reading one key takes a path of its own on both stores (no IN list, no pipeline);
    it must give what the same key gives inside a batch, for every status."""
    store, view, merchants = store_and_view
    store.write(view, [row(1, 1000, 1000, 3, 1.0), row(2, 500, 500, 4, None)])
    store.write(merchants, [OnlineRow(("m1",), 5 * S, 0, {"risk": 0.5, "category": "c"})])
    for v, keys, feats in [(view, [(1,), (2,), (42,)], ["txn_count", "avg_amount"]),
                           (merchants, [("m1",), ("zz",)], ["risk", "category"])]:
        now = 1100 * S  # key 2 (event 500 s, ttl 200 s) is expired here
        batch = store.read(v, keys, feats, now)
        cols, statuses = store.read_columns(v, keys, feats, now)
        for i, k in enumerate(keys):
            assert store.read(v, [k], feats, now) == [batch[i]]
            one_cols, one_status = store.read_columns(v, [k], feats, now)
            assert one_status == [statuses[i]]
            assert one_cols == [[c[i]] for c in cols]
        # The same key twice and no keys at all: a row per key asked for, in order.
        twice = keys[:1] + keys + keys[:1]
        assert store.read(v, twice, feats, now) == batch[:1] + batch + batch[:1]
        assert store.read_columns(v, twice, feats, now) == (
            [c[:1] + c + c[:1] for c in cols], statuses[:1] + statuses + statuses[:1])
        assert store.read(v, [], feats, now) == []
        assert store.read_columns(v, [], feats, now) == ([[] for _ in feats], [])
        if v is view:
            assert [b.status for b in batch] == [Status.PRESENT, Status.EXPIRED,
                                                 Status.MISSING]
            assert statuses == ["present", "expired", "missing"]
            assert cols == [[3, None, None], [1.0, None, None]]
