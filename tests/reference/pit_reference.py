"""A deliberately plain pandas reference of point-in-time retrieval, the test oracle.

For every entity row and view: the candidate feature rows with the same keys,
event time <= the entity time, and (with a TTL) event time >= entity time - TTL;
the winner is the last after sorting by (event time, created time).
"""

from __future__ import annotations

import pandas as pd


def point_in_time(entities: pd.DataFrame, ts_col: str,
                  views: list[tuple[str, list[str], pd.DataFrame, list[str], str, str | None,
                                    float | None]],
                  full_names: bool = False) -> pd.DataFrame:
    """views: (name, join_keys, source, features, ts column, created column, ttl seconds)."""
    out = entities.copy()
    out[ts_col] = pd.to_datetime(out[ts_col], utc=True)
    for name, keys, src, feats, ts, created, ttl in views:
        src = src.copy()
        src[ts] = pd.to_datetime(src[ts], utc=True)
        if created:
            src[created] = pd.to_datetime(src[created], utc=True)
        values: dict[str, list[object]] = {f: [] for f in feats}
        for _, row in out.iterrows():
            cand = src
            for k in keys:
                cand = cand[cand[k] == row[k]]
            t = row[ts_col]
            cand = cand[cand[ts] <= t]
            if ttl:
                cand = cand[cand[ts] >= t - pd.Timedelta(seconds=ttl)]
            if cand.empty:
                for f in feats:
                    values[f].append(None)
                continue
            order = [ts, created] if created else [ts]
            best = cand.sort_values(order, kind="stable").iloc[-1]
            for f in feats:
                values[f].append(best[f])
        for f in feats:
            out[f"{name}__{f}" if full_names else f] = values[f]
    return out
