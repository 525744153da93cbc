"""The embedded online store: one SQLite table per view, keyed by the entity key.

Newer-wins is a single UPSERT whose update only fires when the incoming row is
newer (a later event time, or the same one with a later created time; the same
version again is skipped), so it holds under concurrent writers too (unlike Feast's SQLite store,
which lets an older write replace a newer one).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from servelab.errors import StoreError
from servelab.features.definitions import FeatureView
from servelab.features.online import (
    OnlineRow,
    OnlineValue,
    Status,
    _keep,
    columns_from_rows,
    converter,
    entity_key,
    oldest_valid_us,
)

_SQL_TYPES = {"int64": "INTEGER", "int32": "INTEGER", "float64": "REAL", "float32": "REAL",
              "string": "TEXT", "bool": "INTEGER"}


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

    def _plan(self, view: FeatureView, features: Sequence[str], n: int
              ) -> tuple[str, list[Any], bool]:
        """The SQL and converters for this shape of read, built once."""
        plan_key = (view.name, tuple(features), n)
        plan = self._plans.get(plan_key)
        if plan is None:
            cols = ", ".join(_q(f) for f in features)
            marks = ", ".join("?" for _ in range(n))
            sql = (f"SELECT entity_key, event_ts, {cols} FROM {_q(view.name)} "
                   f"WHERE entity_key IN ({marks})" if n != 1 else  # one key: no IN list
                   f"SELECT event_ts, {cols} FROM {_q(view.name)} WHERE entity_key = ?")
            convs = [converter(view.dtype(f), typed=True) for f in features]
            plan = (sql, convs, all(c is _keep for c in convs))
            self._plans[plan_key] = plan
        return plan

    def read(self, view: FeatureView, keys: list[tuple[Any, ...]], features: list[str],
             now_us: int) -> list[OnlineValue]:
        if len(keys) == 1:
            return self._read_one(view, keys[0], features, now_us)
        sql, convs, plain = self._plan(view, features, len(keys))
        stored = [entity_key(k) for k in keys]
        try:
            found = {r[0]: r for r in self.con.execute(sql, stored)}
        except sqlite3.Error as exc:
            raise self._read_failed(view, exc) from exc
        oldest = oldest_valid_us(view, now_us)
        get, present = found.get, Status.PRESENT
        if plain:  # the hot path: every value comes back typed already
            return [OnlineValue(dict(zip(features, row[2:], strict=False)), present, row[1])
                    if (row := get(k)) is not None and row[1] >= oldest
                    else _absent(features, row and row[1]) for k in stored]
        return [OnlineValue({f: None if v is None else c(v)
                             for f, c, v in zip(features, convs, row[2:], strict=True)},
                            present, row[1])
                if (row := get(k)) is not None and row[1] >= oldest
                else _absent(features, row and row[1]) for k in stored]

    def read_columns(self, view: FeatureView, keys: list[tuple[Any, ...]], features: Sequence[str],
                     now_us: int) -> tuple[list[list[Any]], list[str]]:
        sql, convs, plain = self._plan(view, features, len(keys))
        try:
            if len(keys) == 1:  # the common online read: one row, fetched as it is
                rows = [self.con.execute(sql, (entity_key(keys[0]),)).fetchone()]
            else:
                stored = [entity_key(k) for k in keys]
                found = {r[0]: r[1:] for r in self.con.execute(sql, stored)}
                get = found.get
                rows = [get(k) for k in stored]
        except sqlite3.Error as exc:
            raise self._read_failed(view, exc) from exc
        return columns_from_rows(rows, oldest_valid_us(view, now_us), len(features),
                                 None if plain else convs)

    def _read_one(self, view: FeatureView, key: tuple[Any, ...], features: Sequence[str],
                  now_us: int) -> list[OnlineValue]:
        sql, convs, plain = self._plan(view, features, 1)
        try:
            row = self.con.execute(sql, (entity_key(key),)).fetchone()
        except sqlite3.Error as exc:
            raise self._read_failed(view, exc) from exc
        if row is None or row[0] < oldest_valid_us(view, now_us):
            return [_absent(features, row and row[0])]
        vals = row[1:] if plain else [None if v is None else c(v)
                                      for c, v in zip(convs, row[1:], strict=True)]
        return [OnlineValue(dict(zip(features, vals, strict=True)), Status.PRESENT, row[0])]

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
