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
from servelab.features.keys import typed_key


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
    if len(key) == 1 and type(key[0]) is int:  # the commonest key: one whole number
        return f"[{key[0]}]"
    if all(type(k) is int for k in key):  # the common case, built without the JSON encoder
        return "[" + ",".join(map(str, key)) + "]"
    return json.dumps(list(key), separators=(",", ":"))


def ttl_us(view: FeatureView) -> int | None:
    """The view's TTL in microseconds, None when values never expire."""
    return round(view.ttl_s * 1e6) if view.ttl_s else None


def oldest_valid_us(view: FeatureView, now_us: int) -> int:
    """The oldest event time still served at `now_us` under the view's TTL (inclusive)."""
    ttl = ttl_us(view)
    return now_us - ttl if ttl is not None else -(2**63)


# One key's prepared read: (key, now_us) -> (the values, typed, or None unless present;
# the status). Built once per view and feature list by `OnlineStore.one_key_reader`.
OneKeyRead = Callable[[tuple[Any, ...], int], tuple[Sequence[Any] | None, str]]
# One entity row's prepared read over several views, one key each, in one round trip:
# (a key per view, now_us) -> per view (values or None, status).
RowRead = Callable[[Sequence[tuple[Any, ...]], int], list[tuple[Sequence[Any] | None, str]]]
# A batch read of several views: (view, keys, features) each.
ViewKeys = tuple[FeatureView, list[tuple[Any, ...]], Sequence[str]]


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

    def one_key_reader(self, view: FeatureView, features: Sequence[str]) -> OneKeyRead:
        """The read of one key, prepared: the online path's commonest call, with its
        statement, converters and TTL bound once."""
        ...

    def row_reader(self, parts: Sequence[tuple[FeatureView, Sequence[str]]]
                   ) -> RowRead | None:
        """One entity row's read of every view it needs, prepared as one round trip; None
        where that saves nothing (an embedded store, or one view: its one-key reads)."""
        ...

    def read_columns_many(self, reads: Sequence[ViewKeys], now_us: int
                          ) -> list[tuple[list[list[Any]], list[str]]]:
        """`read_columns` for several views at once, in one round trip where the store
        has round trips (Redis)."""
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
    plan, row_read = _read_plan(repo, store, features, full_feature_names)
    if lengths == {1}:  # one entity row: the online path's commonest call
        return _one_row(plan, row_read, entities, now_us)
    out: dict[str, list[Any]] = {k: list(v) for k, v in entities.items()}
    reads: list[ViewKeys] = []
    for step in plan:
        if len(step.join_keys) == 1:  # the common case, without a tuple comprehension per row
            col = entities.get(step.join_keys[0])
            if col is None:
                raise _missing_keys(step.view, entities)
            if set(map(type, col)) == {step.key_types[0]}:  # typed already: no call a key
                keys = list(zip(col))
            else:
                conv = step.key_convs[0]
                keys = [(conv(v),) for v in col]
        else:
            if not entities.keys() >= set(step.join_keys):
                raise _missing_keys(step.view, entities)
            keys = list(zip(*[[c(v) for v in entities[k]]
                              for c, k in zip(step.key_convs, step.join_keys, strict=True)],
                            strict=True))
        reads.append((step.view, keys, step.features))
    for step, (cols, statuses) in zip(plan, store.read_columns_many(reads, now_us),
                                      strict=True):
        out.update(zip(step.names, cols, strict=True))
        out.update(dict.fromkeys(step.status_names, statuses))  # one list per view, shared
    return out


def _one_row(plan: list[_ViewRead], row_read: RowRead | None,
             entities: dict[str, list[Any]], now_us: int) -> dict[str, list[Any]]:
    """`get_online_features` for one entity row: each view's prepared one-key read, or the
    store's read of every view at once (one round trip), and the result built straight
    from its rows (the same columns as the batch path)."""
    out: dict[str, list[Any]] = {k: list(v) for k, v in entities.items()}
    keys: list[tuple[Any, ...]] = []
    got: list[tuple[Sequence[Any] | None, str]] = []
    for view, _, key_convs, _types, _names, _status_names, join_keys, one in plan:
        if len(join_keys) == 1:
            col = entities.get(join_keys[0])
            if col is None:
                raise _missing_keys(view, entities)
            key: tuple[Any, ...] = (key_convs[0](col[0]),)
        else:
            if not entities.keys() >= set(join_keys):
                raise _missing_keys(view, entities)
            key = tuple([c(entities[k][0]) for c, k in zip(key_convs, join_keys, strict=True)])
        if row_read is None:
            got.append(one(key, now_us))
        else:
            keys.append(key)
    if row_read is not None:
        got = row_read(keys, now_us)
    for step, (values, status) in zip(plan, got, strict=True):
        names = step.names
        if values is None:
            values = (None,) * len(names)
        for name, v in zip(names, values, strict=True):
            out[name] = [v]
        statuses = [status]  # one list per view, shared, as on the batch path
        for name in step.status_names:
            out[name] = statuses
    return out


def _missing_keys(view: FeatureView, entities: dict[str, list[Any]]) -> Exception:
    missing = [k for k in view.join_keys if k not in entities]
    return invalid("entities", sorted(entities), f"join keys {missing} for view "
                   f"{view.name!r}", f"add e.g. --entity {missing[0]}=1")


def columns_from_rows(rows: list[Any], oldest_us: int, n_features: int,
                      convs: list[Callable[[Any], Any]] | None) -> tuple[list[list[Any]],
                                                                         list[str]]:
    """Per key a stored row (event time, then the values): the feature columns (None where
    not present) and the status values. A key never written is None or a row whose event
    time is None. `convs` None: values are typed."""
    if len(rows) == 1:  # one entity, the common online read: no transposition
        r = rows[0]
        if r is not None and r[0] is not None and r[0] >= oldest_us:
            if convs is None:
                return [[v] for v in r[1:]], [PRESENT]
            return [[None if v is None else c(v)] for c, v in zip(convs, r[1:], strict=True)
                    ], [PRESENT]
        missing = r is None or r[0] is None
        return [[None] for _ in range(n_features)], [MISSING if missing else EXPIRED]
    statuses = [MISSING if r is None or r[0] is None else
                (EXPIRED if r[0] < oldest_us else PRESENT) for r in rows]
    return columns_given(rows, statuses, n_features, convs), statuses


def columns_given(rows: list[Any], statuses: list[str], n_features: int,
                  convs: list[Callable[[Any], Any]] | None) -> list[list[Any]]:
    """The feature columns of rows (each a stored time, then the values) whose statuses
    are known: None where not present, converted by `convs` unless None."""
    if _all_present(statuses) and convs is None:  # the hot path
        if not rows:
            return [[] for _ in range(n_features)]
        return [list(c) for c in zip(*rows, strict=True)][1:]
    blank = (None,) * (n_features + 1)
    kept = [r if st is PRESENT else blank for r, st in zip(rows, statuses, strict=True)]
    cols = [list(c) for c in zip(*kept, strict=True)][1:] if kept else \
        [[] for _ in range(n_features)]
    if convs is not None:  # (map over a column without None: the loop runs in C)
        cols = [list(map(c, col)) if None not in col else [None if v is None else c(v)
                                                           for v in col]
                for c, col in zip(convs, cols, strict=True)]
    return cols


PRESENT, EXPIRED, MISSING = (Status.PRESENT.value, Status.EXPIRED.value,
                             Status.MISSING.value)


def _all_present(statuses: list[str]) -> bool:
    return all(st is PRESENT for st in statuses)


class _ViewRead(NamedTuple):
    """One view's part of a `get_online_features` call, prepared once per feature list and
    store: its features, key converters, output names and the store's one-key read."""

    view: FeatureView
    features: tuple[str, ...]
    key_convs: list[Callable[[Any], Any]]
    key_types: list[type]  # each key's Python type once typed (int or str)
    names: list[str]
    status_names: list[str]
    join_keys: tuple[str, ...]
    one: OneKeyRead


def _read_plan(repo: Repo, store: OnlineStore, features: list[str], full: bool
               ) -> tuple[list[_ViewRead], RowRead | None]:
    """Per view: its features, key converters and output names; and the store's prepared
    read of one entity row over all of them. Kept on the repo (bounded with its other
    derived entries) for this store."""
    key = ("online-plan", tuple(features), full, id(store))
    hit: tuple[OnlineStore, list[_ViewRead], RowRead | None] | None = repo.cache.get(key)
    if hit is not None and hit[0] is store:  # (the entry holds its store: an id not reused)
        return hit[1], hit[2]
    by_view: dict[str, tuple[FeatureView, list[str]]] = {}
    for view, feat in repo.resolve(features):
        by_view.setdefault(view.name, (view, []))[1].append(feat)
    plan = []
    for view, feats in by_view.values():
        names = [f"{view.name}__{f}" if full else f for f in feats]
        plan.append(_ViewRead(view, tuple(feats), [_key_converter(view, k) for k in view.join_keys],
                              [_key_type(view, k) for k in view.join_keys],
                              names, [f"{nm}__status" for nm in names], tuple(view.join_keys),
                              store.one_key_reader(view, feats)))
    row_read = store.row_reader([(p.view, p.features) for p in plan])
    repo.cache[key] = (store, plan, row_read)
    return plan, row_read


def _key_type(view: FeatureView, key: str) -> type:
    return str if dict(view.key_dtypes)[key] == "string" else int


def _key_converter(view: FeatureView, key: str) -> Callable[[Any], Any]:
    """A join-key value in its declared type (features/keys.py: the offline join types
    its key columns the same way)."""
    dtype = dict(view.key_dtypes)[key]
    want = _key_type(view, key)

    def conv(value: Any) -> Any:
        if type(value) is want:  # the common case, at no cost
            return value
        return typed_key(key, dtype, value)

    return conv
