"""The embedded online store: one SQLite table per view, keyed by the entity key.

Newer-wins is a single UPSERT whose update only fires when the incoming row is
newer (a later event time, or the same one with a later created time; the same
version again is skipped), so it holds under concurrent writers too (unlike Feast's SQLite store,
which lets an older write replace a newer one).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

from servelab.errors import StoreError
from servelab.features.definitions import FeatureView
from servelab.features.online import (
    EXPIRED,
    MISSING,
    PRESENT,
    OneKeyRead,
    OnlineRow,
    OnlineValue,
    RowRead,
    Status,
    ViewKeys,
    _keep,
    columns_from_rows,
    converter,
    entity_key,
    oldest_valid_us,
    ttl_us,
)

_SQL_TYPES = {"int64": "INTEGER", "int32": "INTEGER", "float64": "REAL", "float32": "REAL",
              "string": "TEXT", "bool": "INTEGER"}


_MAX_PLANS = 1_000  # read statements kept per store; past it the cache starts over


def _json_keys(keys: list[tuple[Any, ...]]) -> str:
    """Keys' stored forms as one JSON array of strings (the parameter of a many-key read)."""
    if keys and set(map(len, keys)) == {1}:  # (map and set: the loops run in C)
        heads = list(map(itemgetter(0), keys))
        if set(map(type, heads)) == {int}:  # whole numbers: nothing to escape
            return '["[' + ']","['.join(map(str, heads)) + ']"]'
    return json.dumps([entity_key(k) for k in keys])


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _absent(features: Sequence[str], event_ts: int | None) -> OnlineValue:
    """A key never written (no event time), or written too long ago (expired)."""
    if event_ts is None:
        return OnlineValue(dict.fromkeys(features), Status.MISSING, None)
    return OnlineValue(dict.fromkeys(features), Status.EXPIRED, event_ts)


class SQLiteStore:
    def __init__(self, path: str) -> None:
        self.path = path
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.con = sqlite3.connect(path, timeout=10.0, isolation_level=None,
                                       check_same_thread=False)
            self.con.execute("PRAGMA journal_mode=WAL")
            self.con.execute("PRAGMA synchronous=NORMAL")
            self.con.execute("CREATE TABLE IF NOT EXISTS _servelab_meta "
                             "(name TEXT PRIMARY KEY, value TEXT)")
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"[project] sqlite_path = {path!r}: cannot open ({exc}); "
                             "fix: choose a writable path") from exc
        try:  # many-key reads use json_each (built into SQLite since 3.38, often before)
            self.con.execute("SELECT count(*) FROM json_each('[]')").fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"online store sqlite: this SQLite ({sqlite3.sqlite_version}) "
                             f"has no JSON functions ({exc}); fix: a Python whose SQLite is "
                             "3.38 or newer, or online = \"redis\"") from exc
        self._plans: dict[tuple[str, tuple[str, ...], int], Any] = {}

    def apply(self, views: list[FeatureView]) -> None:
        for v in views:
            cols = ", ".join(f"{_q(f)} {_SQL_TYPES[t]}" for f, t in v.features)
            self.con.execute(f"CREATE TABLE IF NOT EXISTS {_q(v.name)} (entity_key TEXT PRIMARY "
                             f"KEY, event_ts INTEGER NOT NULL, created_ts INTEGER NOT NULL, "
                             f"{cols})")
            have = {r[1] for r in self.con.execute(f"PRAGMA table_info({_q(v.name)})")}
            for f, t in v.features:  # a feature added to a view later
                if f not in have:
                    self.con.execute(f"ALTER TABLE {_q(v.name)} ADD COLUMN {_q(f)} "
                                     f"{_SQL_TYPES[t]}")

    def write(self, view: FeatureView, rows: list[OnlineRow]) -> tuple[int, int]:
        feats = view.feature_names
        cols = ", ".join(_q(f) for f in feats)
        marks = ", ".join("?" for _ in feats)
        sets = ", ".join(f"{_q(f)} = excluded.{_q(f)}" for f in feats)
        sql = (f"INSERT INTO {_q(view.name)} (entity_key, event_ts, created_ts, {cols}) "
               f"VALUES (?, ?, ?, {marks}) ON CONFLICT(entity_key) DO UPDATE SET "
               f"event_ts = excluded.event_ts, created_ts = excluded.created_ts, {sets} "
               f"WHERE excluded.event_ts > {_q(view.name)}.event_ts OR "
               f"(excluded.event_ts = {_q(view.name)}.event_ts AND "
               f"excluded.created_ts > {_q(view.name)}.created_ts)")
        before = self.con.total_changes
        try:
            self.con.execute("BEGIN")
            self.con.executemany(sql, [
                (entity_key(r.key), r.event_ts_us, r.created_ts_us,
                 *(r.values.get(f) for f in feats)) for r in rows])
            self.con.execute("COMMIT")
        except sqlite3.Error as exc:
            self.con.execute("ROLLBACK")
            raise StoreError(f"online store sqlite {self.path}: write to {view.name!r} failed "
                             f"({exc}); fix: run `servelab features apply` first") from exc
        written = self.con.total_changes - before
        return written, len(rows) - written

    def _plan(self, view: FeatureView, features: Sequence[str], one: bool
              ) -> tuple[str, list[Any], bool]:
        """The SQL and converters for a read of one key or of many, built once per view and
        feature list (at most _MAX_PLANS kept: feature lists can come from requests)."""
        plan_key = (view.name, tuple(features), one)
        plan = self._plans.get(plan_key)
        if plan is None:
            cols = ", ".join("t." + _q(f) for f in features)
            # Many keys: one statement for any number, the keys as one JSON array, the rows
            # back in the keys' order (a key never written: a row of NULLs), so no lookup by
            # key in Python. It runs as fast as `IN (?, ...)` and has no variable limit.
            sql = (f"SELECT t.event_ts, {cols} FROM {_q(view.name)} t WHERE t.entity_key = ?"
                   if one else
                   f"SELECT t.event_ts, {cols} FROM json_each(?) k LEFT JOIN {_q(view.name)} t "
                   f"ON t.entity_key = k.value ORDER BY k.key")
            convs = [converter(view.dtype(f), typed=True) for f in features]
            plan = (sql, convs, all(c is _keep for c in convs))
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            self._plans[plan_key] = plan
        return plan

    def _rows(self, view: FeatureView, keys: list[tuple[Any, ...]], features: Sequence[str]
              ) -> tuple[list[Any], list[Any], bool]:
        """Each key's stored row (event time, then the values; all None when the key was
        never written), in the keys' order, with the plan's converters."""
        sql, convs, plain = self._plan(view, features, len(keys) == 1)
        try:
            if len(keys) == 1:
                row = self.con.execute(sql, (entity_key(keys[0]),)).fetchone()
                return [row or (None,) * (len(features) + 1)], convs, plain
            return self.con.execute(sql, (_json_keys(keys),)).fetchall(), convs, plain
        except sqlite3.Error as exc:
            raise self._read_failed(view, exc) from exc

    def read(self, view: FeatureView, keys: list[tuple[Any, ...]], features: list[str],
             now_us: int) -> list[OnlineValue]:
        rows, convs, plain = self._rows(view, keys, features)
        oldest, present = oldest_valid_us(view, now_us), Status.PRESENT
        if plain:  # the hot path: every value comes back typed already
            return [OnlineValue(dict(zip(features, row[1:], strict=True)), present, row[0])
                    if row[0] is not None and row[0] >= oldest
                    else _absent(features, row[0]) for row in rows]
        return [OnlineValue({f: None if v is None else c(v)
                             for f, c, v in zip(features, convs, row[1:], strict=True)},
                            present, row[0])
                if row[0] is not None and row[0] >= oldest
                else _absent(features, row[0]) for row in rows]

    def read_columns(self, view: FeatureView, keys: list[tuple[Any, ...]], features: Sequence[str],
                     now_us: int) -> tuple[list[list[Any]], list[str]]:
        rows, convs, plain = self._rows(view, keys, features)
        return columns_from_rows(rows, oldest_valid_us(view, now_us), len(features),
                                 None if plain else convs)

    def one_key_reader(self, view: FeatureView, features: Sequence[str]) -> OneKeyRead:
        sql, convs, plain = self._plan(view, features, True)
        execute, ttl = self.con.execute, ttl_us(view)

        def read(key: tuple[Any, ...], now_us: int) -> tuple[Sequence[Any] | None, str]:
            try:
                row = execute(sql, (entity_key(key),)).fetchone()
            except sqlite3.Error as exc:
                raise self._read_failed(view, exc) from exc
            if row is None:
                return None, MISSING
            if ttl is not None and row[0] < now_us - ttl:
                return None, EXPIRED
            if plain:
                return row[1:], PRESENT
            return [None if v is None else c(v) for c, v in zip(convs, row[1:], strict=True)
                    ], PRESENT

        return read

    def row_reader(self, parts: Sequence[tuple[FeatureView, Sequence[str]]]
                   ) -> RowRead | None:
        return None  # no round trips in an embedded store: each view's one-key read

    def read_columns_many(self, reads: Sequence[ViewKeys], now_us: int
                          ) -> list[tuple[list[list[Any]], list[str]]]:
        return [self.read_columns(v, k, f, now_us) for v, k, f in reads]

    def _read_failed(self, view: FeatureView, exc: sqlite3.Error) -> StoreError:
        return StoreError(f"online store sqlite {self.path}: read of {view.name!r} failed "
                          f"({exc}); fix: run `servelab features apply`")

    def get_meta(self, name: str) -> str | None:
        row = self.con.execute("SELECT value FROM _servelab_meta WHERE name = ?",
                               (name,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, name: str, value: str) -> None:
        self.con.execute("INSERT INTO _servelab_meta VALUES (?, ?) ON CONFLICT(name) DO UPDATE "
                         "SET value = excluded.value", (name, value))

    def close(self) -> None:
        self.con.close()
