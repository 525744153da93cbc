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
from collections.abc import Callable, Sequence
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

    def read_columns(self, view: FeatureView, keys: list[tuple[Any, ...]], features: Sequence[str],
                     now_us: int) -> tuple[list[list[Any]], list[str]]:
        """The same read as columns: one list per feature, and each key's status value
        (what `get_online_features` returns, without a dict per row)."""
        ...

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
    lengths = {len(v) for v in entities.values()}
    if len(lengths) > 1:
        raise invalid("entities", {k: len(v) for k, v in entities.items()},
                      "the same number of values for every join key",
                      "give one value per entity row for each key")
    out: dict[str, list[Any]] = {k: list(v) for k, v in entities.items()}
    for step in _read_plan(repo, features, full_feature_names):
        view, feats, convs, names, status_names, join_keys = step
        if len(join_keys) == 1:  # the common case, without a tuple comprehension per row
            col = entities.get(join_keys[0])
            if col is None:
                raise _missing_keys(view, entities)
            conv = convs[0]
            keys = [(conv(v),) for v in col]
        else:
            if not entities.keys() >= set(join_keys):
                raise _missing_keys(view, entities)
            keys = list(zip(*[[c(v) for v in entities[k]]
                              for c, k in zip(convs, join_keys, strict=True)], strict=True))
        cols, statuses = store.read_columns(view, keys, feats, now_us)
        out.update(zip(names, cols, strict=True))
        out.update(dict.fromkeys(status_names, statuses))  # one list per view, shared
    return out


def _missing_keys(view: FeatureView, entities: dict[str, list[Any]]) -> Exception:
    missing = [k for k in view.join_keys if k not in entities]
    return invalid("entities", sorted(entities), f"join keys {missing} for view "
                   f"{view.name!r}", f"add e.g. --entity {missing[0]}=1")


def columns_from_rows(rows: list[Any], oldest_us: int, n_features: int,
                      convs: list[Callable[[Any], Any]] | None) -> tuple[list[list[Any]],
                                                                         list[str]]:
    """Per key a stored row (event time, then the values) or None: the feature columns
    (None where not present) and the status values. `convs` None: values are typed."""
    if len(rows) == 1:  # one entity, the common online read: no transposition
        r = rows[0]
        if r is not None and r[0] >= oldest_us:
            if convs is None:
                return [[v] for v in r[1:]], [PRESENT]
            return [[None if v is None else c(v)] for c, v in zip(convs, r[1:], strict=True)
                    ], [PRESENT]
        return [[None] for _ in range(n_features)], [MISSING if r is None else EXPIRED]
    statuses = [MISSING if r is None else (EXPIRED if r[0] < oldest_us else PRESENT)
                for r in rows]
    if _all_present(statuses) and convs is None:  # the hot path
        if not rows:
            return [[] for _ in range(n_features)], statuses
        return [list(c) for c in zip(*rows, strict=True)][1:], statuses
    blank = (None,) * (n_features + 1)
    kept = [r if st is PRESENT else blank for r, st in zip(rows, statuses, strict=True)]
    cols = [list(c) for c in zip(*kept, strict=True)][1:] if kept else \
        [[] for _ in range(n_features)]
    if convs is not None:
        cols = [[None if v is None else c(v) for v in col]
                for c, col in zip(convs, cols, strict=True)]
    return cols, statuses


PRESENT, EXPIRED, MISSING = (Status.PRESENT.value, Status.EXPIRED.value,
                             Status.MISSING.value)


def _all_present(statuses: list[str]) -> bool:
    return all(st is PRESENT for st in statuses)


ReadPlan = list[tuple[FeatureView, tuple[str, ...], list[Callable[[Any], Any]],
                     list[str], list[str], tuple[str, ...]]]


def _read_plan(repo: Repo, features: list[str], full: bool) -> ReadPlan:
    """Per view: its features, key converters and output names; kept on the repo."""
    key = ("online-plan", tuple(features), full)
    plan: ReadPlan | None = repo.cache.get(key)
    if plan is None:
        by_view: dict[str, tuple[FeatureView, list[str]]] = {}
        for view, feat in repo.resolve(features):
            by_view.setdefault(view.name, (view, []))[1].append(feat)
        plan = []
        for view, feats in by_view.values():
            names = [f"{view.name}__{f}" if full else f for f in feats]
            plan.append((view, tuple(feats),
                         [_key_converter(view, k) for k in view.join_keys],
                         names, [f"{nm}__status" for nm in names], tuple(view.join_keys)))
        repo.cache[key] = plan
    return plan


def _key_converter(view: FeatureView, key: str) -> Callable[[Any], Any]:
    """A join-key value in its declared type (so "5" typed on a command line finds 5)."""
    dtype = dict(view.key_dtypes)[key]
    want = int if dtype.startswith("int") else str

    def conv(value: Any) -> Any:
        if type(value) is want:
            return value
        try:
            return want(value)
        except (TypeError, ValueError):
            raise invalid(f"entity {key}", value, f"a {dtype} value",
                          f"give {key} as a {'whole number' if want is int else 'string'}"
                          ) from None

    return conv
