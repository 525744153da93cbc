"""Random feature data with every edge case the point-in-time contract names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

BASE = pd.Timestamp("2024-05-01T00:00:00")  # naive: UTC by the contract
USER_TTL_S = 200.0

REPO_TOML = """
[project]
name = "contract"
offline = "duckdb"
online = "sqlite"

[entities.user]
join_keys = ["user_id"]
dtypes = {{ user_id = "int64" }}

[entities.merchant]
join_keys = ["merchant_id"]
dtypes = {{ merchant_id = "string" }}

[views.user_stats]
entities = ["user"]
source = "{user_source}"
timestamp = "event_ts"
created = "created_ts"
ttl_s = {ttl}
features = {{ txn_count = "int64", avg_amount = "float64" }}

[views.merchant_risk]
entities = ["merchant"]
source = "{merchant_source}"
timestamp = "ts"
features = {{ risk = "float64", category = "string" }}

[services.fraud]
features = ["user_stats:txn_count", "merchant_risk:risk"]
"""


def make_repo(root: Path, seed: int = 0, n_entities: int = 300, fmt: str = "parquet"
              ) -> tuple[Path, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    # user_stats: several rows per user, repeated event times told apart by created time.
    rows = []
    for user in range(1, 21):
        times = rng.integers(0, 1000, rng.integers(1, 12))
        times = np.concatenate([times, times[: len(times) // 3]])  # event-time ties
        for k, t in enumerate(times):
            rows.append({"user_id": user, "event_ts": BASE + pd.Timedelta(seconds=int(t)),
                         "created_ts": BASE + pd.Timedelta(seconds=int(t) + k + 1),
                         "txn_count": int(rng.integers(0, 100)),
                         "avg_amount": float(np.round(rng.uniform(1, 500), 2))})
    users = pd.DataFrame(rows)
    merchants = pd.DataFrame([
        {"merchant_id": f"m{m}", "ts": BASE + pd.Timedelta(seconds=int(t)),
         "risk": float(np.round(rng.uniform(), 3)), "category": f"c{int(rng.integers(0, 4))}"}
        for m in range(1, 9) for t in rng.choice(1000, size=rng.integers(1, 6), replace=False)])
    # Entity rows: unknown keys, times before any row, exact event times, exact TTL edges,
    # duplicates, and a non-UTC time zone.
    ent = pd.DataFrame({
        "user_id": rng.integers(0, 23, n_entities),
        "merchant_id": [f"m{i}" for i in rng.integers(0, 10, n_entities)],
        "event_timestamp": [BASE + pd.Timedelta(seconds=int(t))
                            for t in rng.integers(-50, 1100, n_entities)],
    })
    exact = users.sample(20, random_state=seed)
    ent.loc[:19, "user_id"] = exact["user_id"].to_numpy()
    ent.loc[:19, "event_timestamp"] = exact["event_ts"].to_numpy()
    edge = users.sample(20, random_state=seed + 1)
    ent.loc[20:39, "user_id"] = edge["user_id"].to_numpy()
    ent.loc[20:39, "event_timestamp"] = (edge["event_ts"]
                                         + pd.Timedelta(seconds=USER_TTL_S)).to_numpy()
    ent.loc[40:44, "event_timestamp"] = (edge["event_ts"].iloc[:5]
                                         + pd.Timedelta(seconds=USER_TTL_S + 1)).to_numpy()
    ent.loc[40:44, "user_id"] = edge["user_id"].iloc[:5].to_numpy()
    ent = pd.concat([ent, ent.iloc[50:60]], ignore_index=True)  # duplicate entity rows
    ent["event_timestamp"] = (pd.to_datetime(ent["event_timestamp"]).dt.tz_localize("UTC")
                              .dt.tz_convert("America/New_York"))
    if fmt == "parquet":
        users.to_parquet(data / "user_stats.parquet")
        merchants.to_parquet(data / "merchant_risk.parquet")
        us, ms = "data/user_stats.parquet", "data/merchant_risk.parquet"
    else:
        users.to_csv(data / "user_stats.csv", index=False)
        merchants.to_csv(data / "merchant_risk.csv", index=False)
        us, ms = "data/user_stats.csv", "data/merchant_risk.csv"
    (root / "feature_repo.toml").write_text(
        REPO_TOML.format(user_source=us, merchant_source=ms, ttl=USER_TTL_S))
    return root, users, merchants, ent


def reference_views(users: pd.DataFrame, merchants: pd.DataFrame,
                    user_feats: list[str], merchant_feats: list[str]) -> list[tuple]:
    out = []
    if user_feats:
        out.append(("user_stats", ["user_id"], users, user_feats, "event_ts", "created_ts",
                    USER_TTL_S))
    if merchant_feats:
        out.append(("merchant_risk", ["merchant_id"], merchants, merchant_feats, "ts", None,
                    None))
    return out
