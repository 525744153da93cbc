"""Online stores: one contract on SQLite (embedded) and Redis (production).

* Write-newer-wins on both: a row replaces the stored one only if its event
  time is later, or equal with a later created time. Re-running an old window
  never overwrites newer values, and writing the same version again is a skip.
* A view's TTL is enforced on read: each value comes back marked present,
  missing (never written) or expired (older than ``now - ttl``; a value exactly
  at the boundary is present, as offline).
* Many entities are read in one round trip.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple, Protocol

from servelab.errors import invalid
from servelab.features.definitions import FeatureView, Repo


class Status(Enum):
    PRESENT = "present"
    MISSING = "missing"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class OnlineRow:
    """One entity's latest feature values, as materialization writes them."""

    key: tuple[Any, ...]
    event_ts_us: int
    created_ts_us: int
    values: dict[str, Any]


class OnlineValue(NamedTuple):
    """One entity's values from one view (a tuple: reads build many of them)."""

    values: dict[str, Any]  # feature -> value (None unless present)
    status: Status
    event_ts_us: int | None


def entity_key(key: tuple[Any, ...]) -> str:
    """The stored form of a join-key tuple: compact JSON, the same on every store."""
    if all(type(k) is int for k in key):  # the common case, built without the JSON encoder
        return "[" + ",".join(map(str, key)) + "]"
    return json.dumps(list(key), separators=(",", ":"))


def oldest_valid_us(view: FeatureView, now_us: int) -> int:
    """The oldest event time still served at `now_us` under the view's TTL (inclusive)."""
    return now_us - round(view.ttl_s * 1e6) if view.ttl_s else -(2**63)


def _to_str(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _to_bool(raw: Any) -> bool:
    return raw in (b"1", "1", 1, True)


def _keep(raw: Any) -> Any:
    return raw


def converter(dtype: str, typed: bool = False) -> Any:
    """How to turn a stored value back into the feature's type. `typed` stores (SQLite)
    already hand back ints, floats and strings; Redis hands back bytes, which int() and
    float() parse directly."""
    if dtype == "bool":
        return _to_bool
    if typed:
        return _keep
    if dtype.startswith("int"):
        return int
    if dtype.startswith("float"):
        return float
    return _to_str


class OnlineStore(Protocol):
    def apply(self, views: list[FeatureView]) -> None: ...

    def write(self, view: FeatureView, rows: list[OnlineRow]) -> tuple[int, int]:
        """Write newer-wins; returns (written, skipped as stale)."""
        ...

    def read(self, view: FeatureView, keys: list[tuple[Any, ...]], features: list[str],
             now_us: int) -> list[OnlineValue]: ...

    def get_meta(self, name: str) -> str | None: ...

    def set_meta(self, name: str, value: str) -> None: ...

    def close(self) -> None: ...


def open_store(repo: Repo, kind: str | None = None) -> OnlineStore:
    """The repo's online store (or the one named)."""
    kind = kind or repo.config.online
    if kind == "sqlite":
        from servelab.features.online.sqlite import SQLiteStore

        return SQLiteStore(repo.config.sqlite_path)
    if kind == "redis":
        from servelab.features.online.redis import RedisStore

        return RedisStore(repo.config.redis_url, repo.config.name,
                          timeout_s=repo.config.redis_timeout_s)
    raise invalid("online store", kind, "sqlite or redis", "use sqlite (embedded) or redis")


def get_online_features(repo: Repo, store: OnlineStore, features: list[str],
                        entities: dict[str, list[Any]], now_us: int,
                        full_feature_names: bool = False) -> dict[str, list[Any]]:
    """Feature values for entity rows given as columns (join key -> values), one batch read
    per view; each feature column comes with a `<name>__status` column."""
    pairs = repo.resolve(features)
    n = len(next(iter(entities.values()), []))
    if any(len(v) != n for v in entities.values()):
        raise invalid("entities", {k: len(v) for k, v in entities.items()},
                      "the same number of values for every join key",
                      "give one value per entity row for each key")
    out: dict[str, list[Any]] = {k: list(v) for k, v in entities.items()}
    by_view: dict[str, tuple[FeatureView, list[str]]] = {}
    for view, feat in pairs:
        by_view.setdefault(view.name, (view, []))[1].append(feat)
    for view, feats in by_view.values():
        missing = [k for k in view.join_keys if k not in entities]
        if missing:
            raise invalid("entities", sorted(entities), f"join keys {missing} for view "
                          f"{view.name!r}", f"add e.g. --entity {missing[0]}=1")
        keys = [tuple(_as_key(view, k, entities[k][i]) for k in view.join_keys)
                for i in range(n)]
        got = store.read(view, keys, feats, now_us)
        for f in feats:
            name = f"{view.name}__{f}" if full_feature_names else f
            out[name] = [g.values[f] for g in got]
            out[f"{name}__status"] = [g.status.value for g in got]
    return out


def _as_key(view: FeatureView, key: str, value: Any) -> Any:
    """A join-key value in its declared type (so "5" typed on a command line finds 5)."""
    dtype = dict(view.key_dtypes)[key]
    try:
        return int(value) if dtype.startswith("int") else str(value)
    except (TypeError, ValueError):
        raise invalid(f"entity {key}", value, f"a {dtype} value", f"give {key} as a number"
                      ) from None
