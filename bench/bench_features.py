"""The feature store against the alternatives, side by side on the same generated data.

1. Point-in-time join: 1M entity rows over two views of 2M rows each (one with a
   TTL): servelab's DuckDB engine vs a hand-written DuckDB ASOF JOIN vs pandas
   merge_asof. All three must give the same values. Target: within 1.2x of the
   raw ASOF join. 1b: a view with a created column and event-time ties, against a raw
   ASOF JOIN ordered by (event time, created time).
2. Online reads for 1 and for 100 entities through the public get_online_features
   (values and per-feature status) vs raw sqlite3 running the same SELECTs (`= ?` and
   fetchone for one key, an IN list for a batch) and raw redis-py (one HMGET, or one
   pipeline of them for every view and key: one round trip). Two requests: one view's
   10 features, and the fraud service (4 features over two views, a user key and a
   merchant key). Target: within 1.2x of the raw store.
3. Materialization rows per second into SQLite and Redis.

    python bench/bench_features.py [--entities 1000000] [--rows 2000000] [--reads 2000]
                                   [--parts pit,ties,online]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.services import redis_server

from servelab.features.definitions import load_repo
from servelab.features.example import generate
from servelab.features.materialization import materialize, to_us
from servelab.features.offline import get_historical_features
from servelab.features.online import get_online_features, open_store

DAY_US = 86_400_000_000
TTL_S = 3 * 86_400

REPO = """
[project]
name = "bench"
[entities.user]
join_keys = ["user_id"]
[entities.merchant]
join_keys = ["merchant_id"]
[views.user_stats]
entities = ["user"]
source = "user_stats.parquet"
timestamp = "ts"
ttl_s = {ttl}
features = {{ u1 = "float64", u2 = "int64" }}
[views.merchant_stats]
entities = ["merchant"]
source = "merchant_stats.parquet"
timestamp = "ts"
features = {{ m1 = "float64" }}
"""


def best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def pit_bench(root: Path, n_entities: int, n_rows: int, repeat: int) -> None:
    rng = np.random.default_rng(0)
    start = np.datetime64("2024-01-01T00:00:00", "us")
    span = 60 * DAY_US
    users, merchants = 100_000, 20_000
    # Unique (key, ts) per view, so "the latest row" is one row and all three agree.
    pq.write_table(pa.table({
        "user_id": rng.integers(1, users + 1, n_rows),
        "ts": start + rng.choice(span, n_rows, replace=False),
        "u1": rng.random(n_rows), "u2": rng.integers(0, 1000, n_rows)}),
        root / "user_stats.parquet")
    pq.write_table(pa.table({
        "merchant_id": rng.integers(1, merchants + 1, n_rows),
        "ts": start + rng.choice(span, n_rows, replace=False),
        "m1": rng.random(n_rows)}), root / "merchant_stats.parquet")
    entities = pa.table({
        "user_id": rng.integers(1, users + 1, n_entities),
        "merchant_id": rng.integers(1, merchants + 1, n_entities),
        "event_timestamp": pa.array(start + rng.integers(0, span, n_entities)).cast(
            pa.timestamp("us", tz="UTC"))})
    (root / "feature_repo.toml").write_text(REPO.format(ttl=TTL_S))
    repo = load_repo(root)
    feats = ["user_stats:u1", "user_stats:u2", "merchant_stats:m1"]

    ours: list[pa.Table] = []
    t_ours = best(lambda: ours.append(get_historical_features(repo, entities, feats)), repeat)

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    us, ms = root / "user_stats.parquet", root / "merchant_stats.parquet"
    raw_sql = f"""
        WITH e AS (SELECT *, row_number() OVER () AS rn FROM ent),
        u AS (SELECT user_id, CAST(ts AS TIMESTAMPTZ) AS ts, u1, u2 FROM read_parquet('{us}')),
        m AS (SELECT merchant_id, CAST(ts AS TIMESTAMPTZ) AS ts, m1 FROM read_parquet('{ms}'))
        SELECT e.user_id, e.merchant_id, e.event_timestamp,
               CASE WHEN u.ts >= e.event_timestamp - INTERVAL {TTL_S} SECOND THEN u.u1 END AS u1,
               CASE WHEN u.ts >= e.event_timestamp - INTERVAL {TTL_S} SECOND THEN u.u2 END AS u2,
               m.m1
        FROM e ASOF LEFT JOIN u ON e.user_id = u.user_id AND e.event_timestamp >= u.ts
               ASOF LEFT JOIN m ON e.merchant_id = m.merchant_id AND e.event_timestamp >= m.ts
        ORDER BY e.rn"""
    raw: list[pa.Table] = []

    def raw_join() -> None:
        con.register("ent", entities)
        raw.append(con.sql(raw_sql).to_arrow_table())
        con.unregister("ent")

    t_raw = best(raw_join, repeat)

    def pandas_join() -> pd.DataFrame:
        e = entities.to_pandas()
        e["rn"] = np.arange(len(e))
        e = e.sort_values("event_timestamp")
        u = pd.read_parquet(us)
        u["ts"] = pd.to_datetime(u["ts"]).dt.tz_localize("UTC")
        m = pd.read_parquet(ms)
        m["ts"] = pd.to_datetime(m["ts"]).dt.tz_localize("UTC")
        out = pd.merge_asof(e, u.sort_values("ts"), left_on="event_timestamp", right_on="ts",
                            by="user_id", tolerance=pd.Timedelta(seconds=TTL_S))
        out = out.drop(columns="ts")
        out = pd.merge_asof(out, m.sort_values("ts"), left_on="event_timestamp",
                            right_on="ts", by="merchant_id")
        return out.sort_values("rn").reset_index(drop=True)

    pand: list[pd.DataFrame] = []
    t_pandas = best(lambda: pand.append(pandas_join()), max(1, repeat - 1))

    a, b, p = ours[-1], raw[-1], pand[-1]
    same_raw = all(a[c].to_pylist() == b[c].to_pylist() for c in ("u1", "u2", "m1"))
    same_pd = (np.allclose(a["u1"].to_numpy(zero_copy_only=False).astype(float),
                           p["u1"].to_numpy(dtype=float), equal_nan=True)
               and np.allclose(a["m1"].to_numpy(zero_copy_only=False).astype(float),
                               p["m1"].to_numpy(dtype=float), equal_nan=True))
    print(f"\n1. point-in-time join, {n_entities:,} entity rows x 2 views of {n_rows:,} rows "
          f"(best of {repeat})")
    print(f"   servelab (DuckDB engine)      {t_ours:7.2f} s")
    print(f"   raw DuckDB ASOF JOIN          {t_raw:7.2f} s   servelab / raw = "
          f"{t_ours / t_raw:.2f}x (target <= 1.2x)   same values: {same_raw}")
    print(f"   pandas merge_asof             {t_pandas:7.2f} s   pandas / servelab = "
          f"{t_pandas / t_ours:.2f}x   same values: {same_pd}")


def pit_ties_bench(root: Path, n_entities: int, n_rows: int, repeat: int) -> None:
    """The same join where a view has a created column and event times repeat: rows at one
    event time are told apart by created time. The raw plan breaks the ties inside one
    ASOF JOIN ordered by (event time, created time), as servelab's engine does."""
    rng = np.random.default_rng(1)
    start = np.datetime64("2024-01-01T00:00:00", "us")
    span = 60 * DAY_US
    users = 100_000
    ts = start + rng.integers(0, span // 1_000_000, n_rows) * 1_000_000  # whole seconds: ties
    cr = ts + rng.permutation(n_rows)  # distinct created times, so the answer is unique
    pq.write_table(pa.table({"user_id": rng.integers(1, users + 1, n_rows), "ts": ts,
                             "cr": cr, "u1": rng.random(n_rows)}), root / "ties.parquet")
    entities = pa.table({
        "user_id": rng.integers(1, users + 1, n_entities),
        "event_timestamp": pa.array(start + rng.integers(0, span, n_entities)).cast(
            pa.timestamp("us", tz="UTC"))})
    (root / "feature_repo.toml").write_text(
        '[project]\nname = "ties"\n[entities.user]\njoin_keys = ["user_id"]\n'
        '[views.ties]\nentities = ["user"]\nsource = "ties.parquet"\ntimestamp = "ts"\n'
        'created = "cr"\nfeatures = { u1 = "float64" }\n')
    repo = load_repo(root)
    ours: list[pa.Table] = []
    t_ours = best(lambda: ours.append(get_historical_features(repo, entities, ["ties:u1"])),
                  repeat)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    raw_sql = f"""
        WITH e AS (SELECT *, row_number() OVER () AS rn,
                          struct_pack(t := event_timestamp, c := 'infinity'::TIMESTAMPTZ) AS o
                   FROM ent),
        u AS (SELECT user_id, struct_pack(t := CAST(ts AS TIMESTAMPTZ),
                                          c := CAST(cr AS TIMESTAMPTZ)) AS o, u1
              FROM read_parquet('{root / "ties.parquet"}'))
        SELECT e.user_id, e.event_timestamp, u.u1
        FROM e ASOF LEFT JOIN u ON e.user_id = u.user_id AND e.o >= u.o ORDER BY e.rn"""
    raw: list[pa.Table] = []

    def raw_join() -> None:
        con.register("ent", entities)
        raw.append(con.sql(raw_sql).to_arrow_table())
        con.unregister("ent")

    t_raw = best(raw_join, repeat)
    same = ours[-1]["u1"].to_pylist() == raw[-1]["u1"].to_pylist()
    print(f"\n1b. the same with event-time ties told apart by created time, {n_entities:,} "
          f"entity rows x 1 view of {n_rows:,} rows (best of {repeat})")
    print(f"   servelab (DuckDB engine)      {t_ours:7.2f} s")
    print(f"   raw ASOF JOIN on (ts, created) {t_raw:6.2f} s   servelab / raw = "
          f"{t_ours / t_raw:.2f}x (target <= 1.2x)   same values: {same}")


def percentiles(times: list[float]) -> tuple[float, float]:
    times = sorted(times)
    return statistics.median(times) * 1e3, times[int(0.99 * (len(times) - 1))] * 1e3


def online_bench(root: Path, reads: int) -> None:
    generate(root, users=20_000, merchants=500, days=30, labels=10)
    repo = load_repo(root)
    end = datetime(2024, 5, 31, tzinfo=UTC)
    now = to_us(end)
    requests = {  # name -> (feature refs, view -> its features)
        "1 view": ([f"user_stats:{f}" for f in repo.views["user_stats"].feature_names],
                   {"user_stats": list(repo.views["user_stats"].feature_names)}),
        "service": (["service:fraud_model_v1"], {}),
    }
    for view, feat in repo.resolve(["service:fraud_model_v1"]):
        requests["service"][1].setdefault(view.name, []).append(feat)
    print(f"\n2. online reads ({reads:,} reads each, p50 / p99 ms): one view's "
          f"{len(requests['1 view'][1]['user_stats'])} features, and the fraud service's "
          f"{len(repo.resolve(['service:fraud_model_v1']))} over two views")
    with redis_server() as url:
        for kind, redis_url in [("sqlite", None), ("redis", url)]:
            if kind == "redis" and redis_url is None:
                print("   redis: redis-server not installed, skipped")
                continue
            if redis_url:
                repo = load_repo(root)
                object.__setattr__(repo.config, "redis_url", redis_url)
            store = open_store(repo, kind)
            t0 = time.perf_counter()
            summ = materialize(repo, store, end=end)
            t_mat = time.perf_counter() - t0
            raw_read = (raw_sqlite_reader(repo) if kind == "sqlite"
                        else raw_redis_reader(repo, redis_url))
            for name, (refs, by_view) in requests.items():
                for n in (1, 100):
                    ours_t, raw_t = [], []
                    for i in range(reads):
                        users = [1 + (i * n + j) % 20_000 for j in range(n)]
                        merchants = [1 + (i * n + j) % 500 for j in range(n)]
                        cols = {"user_id": users, "merchant_id": merchants}
                        # Interleave the two, so machine noise hits both alike.
                        t0 = time.perf_counter()
                        get_online_features(repo, store, refs, cols, now)
                        t1 = time.perf_counter()
                        raw_read(by_view, users, merchants)
                        t2 = time.perf_counter()
                        ours_t.append(t1 - t0)
                        raw_t.append(t2 - t1)
                    (o50, o99), (r50, r99) = percentiles(ours_t), percentiles(raw_t)
                    print(f"   {kind:6} {name:7} {n:3} entities  servelab {o50:6.3f} / "
                          f"{o99:6.3f}   raw {r50:6.3f} / {r99:6.3f}   p50 ratio "
                          f"{o50 / r50:.2f}x (target <= 1.2x)")
            rate = summ.rows_read / t_mat
            print(f"   {kind:6} materialization: {summ.rows_read:,} rows read, "
                  f"{summ.written:,} written in {t_mat:.2f} s = {rate:,.0f} rows/s")
            store.close()


def _keys(view: str, users: list[int], merchants: list[int]) -> list[int]:
    return users if view == "user_stats" else merchants


def raw_sqlite_reader(repo: Any) -> Any:
    """The same SELECTs servelab runs, by hand: `= ?` and fetchone for one key, an IN
    list for a batch, one per view."""
    con = sqlite3.connect(repo.config.sqlite_path)

    def read(by_view: dict[str, list[str]], users: list[int], merchants: list[int]) -> None:
        for view, feats in by_view.items():
            cols = ", ".join(f'"{f}"' for f in feats)
            keys = _keys(view, users, merchants)
            if len(keys) == 1:
                con.execute(f"SELECT event_ts, {cols} FROM {view} WHERE entity_key = ?",
                            (f"[{keys[0]}]",)).fetchone()
                continue
            con.execute(f"SELECT entity_key, event_ts, {cols} FROM {view} WHERE entity_key "
                        f"IN ({', '.join('?' for _ in keys)})",
                        [f"[{k}]" for k in keys]).fetchall()

    return read


def raw_redis_reader(repo: Any, url: str) -> Any:
    """Every view and key of a request in one round trip: one HMGET when there is one,
    else one pipeline of HMGETs."""
    client = redis.Redis.from_url(url)

    def read(by_view: dict[str, list[str]], users: list[int], merchants: list[int]) -> None:
        todo = [(f"{repo.config.name}:{view}:[{k}]", ["_ts", *feats])
                for view, feats in by_view.items() for k in _keys(view, users, merchants)]
        if len(todo) == 1:
            client.hmget(*todo[0])
            return
        pipe = client.pipeline(transaction=False)
        for key, fields in todo:
            pipe.hmget(key, fields)
        pipe.execute()

    return read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--entities", type=int, default=1_000_000)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--reads", type=int, default=2_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--parts", default="pit,ties,online",
                    help="which parts to run, comma-separated: pit, ties, online")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        if "pit" in parts:
            Path(tmp, "pit").mkdir()
            pit_bench(Path(tmp, "pit"), args.entities, args.rows, args.repeat)
        if "ties" in parts:
            Path(tmp, "ties").mkdir()
            pit_ties_bench(Path(tmp, "ties"), args.entities, args.rows, args.repeat)
        if "online" in parts:
            online_bench(Path(tmp, "online"), args.reads)


if __name__ == "__main__":
    main()
