"""The embedded offline engine: one DuckDB query of ASOF joins, one per feature view.

Per view: (if the view has a created-time column) keep the latest created row
per key and event time, then ``ASOF LEFT JOIN`` on the join keys and
``entity.ts >= view.ts`` — DuckDB picks the latest feature row at or before
each entity row — and null out a match older than the view's TTL (the latest
candidate is the only one that could be within it).
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa

from servelab.errors import InputError, StoreError
from servelab.features.definitions import FeatureView, Repo, SourceFormat
from servelab.features.offline import (
    ENTITY_TS,
    ROW,
    check_columns,
    check_output_names,
    group_by_view,
    output_name,
    prepare_entities,
)

SQL_TYPES = {"int64": "BIGINT", "int32": "INTEGER", "float64": "DOUBLE", "float32": "FLOAT",
             "string": "VARCHAR", "bool": "BOOLEAN"}
_COMPATIBLE = {
    "int64": ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER"),
    "int32": ("TINYINT", "SMALLINT", "INTEGER"),
    "float64": ("FLOAT", "DOUBLE", "DECIMAL", "TINYINT", "SMALLINT", "INTEGER", "BIGINT"),
    "float32": ("FLOAT", "DOUBLE", "DECIMAL", "TINYINT", "SMALLINT", "INTEGER", "BIGINT"),
    "string": ("VARCHAR",),
    "bool": ("BOOLEAN",),
}
_TIME_TYPES = ("TIMESTAMP", "DATE")


def q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def source_sql(view: FeatureView) -> str:
    """A FROM-able expression for the view's source."""
    s = view.source
    if s.format is SourceFormat.PARQUET:
        return f"read_parquet({lit(s.path)})"
    if s.format is SourceFormat.CSV:
        return f"read_csv({lit(s.path)}, header = true)"
    assert s.table is not None
    return f"(SELECT * FROM src_{view.name}.{q(s.table)})"


class DuckDBEngine:
    def __init__(self, repo: Repo, con: duckdb.DuckDBPyConnection | None = None) -> None:
        self.repo = repo
        # No progress bar: DuckDB prints it to stdout on long queries, where `--json` output
        # goes.
        self.con = con or duckdb.connect()
        self.con.execute("SET TimeZone = 'UTC'")
        self.con.execute("SET enable_progress_bar = false")
        self._checked: set[str] = set()

    def attach(self, view: FeatureView) -> None:
        if view.source.format is SourceFormat.DUCKDB:
            alias = f"src_{view.name}"
            attached = {r[0] for r in self.con.execute("SELECT database_name FROM "
                                                       "duckdb_databases()").fetchall()}
            if alias not in attached:
                self.con.execute(f"ATTACH {lit(view.source.path)} AS {q(alias)} (READ_ONLY)")

    def check_source(self, view: FeatureView) -> None:
        """The source has the view's columns, with types that fit the declared ones."""
        if view.name in self._checked:
            return
        self.attach(view)
        where = f"[views.{view.name}] source {view.source.path}"
        try:
            cols = {r[0]: r[1] for r in self.con.execute(
                f"DESCRIBE SELECT * FROM {source_sql(view)}").fetchall()}
        except duckdb.Error as exc:
            raise StoreError(f"{where}: cannot be read ({exc}); "
                             "fix: check the path and the file's format") from exc
        check_columns(view, view.feature_names, cols, _COMPATIBLE, _TIME_TYPES)
        self._checked.add(view.name)

    def view_sql(self, view: FeatureView, features: list[str]) -> str:
        """The view's rows for the ASOF join. With a created column, rows at one event time
        are told apart inside the join itself: it orders by (event time, created time), so
        of the rows at or before an entity's time it takes the latest event and, among
        that event's rows, the latest created (a row without one comes last). No separate
        de-duplication pass over the source."""
        keys = ", ".join(q(k) for k in view.join_keys)
        cols = ", ".join(q(f) for f in features)
        ts = f"CAST({q(view.timestamp)} AS TIMESTAMPTZ)"
        order = ts
        if view.created:
            order = (f"struct_pack(t := {ts}, c := COALESCE(CAST({q(view.created)} AS "
                     "TIMESTAMPTZ), '-infinity'::TIMESTAMPTZ))")
        return f"SELECT {keys}, {ts} AS __ts, {order} AS __ord, {cols} FROM {source_sql(view)}"

    def get_historical_features(self, entity_rows: Any, features: list[str], *,
                                full_feature_names: bool = False,
                                timestamp_column: str = ENTITY_TS) -> pa.Table:
        pairs = self.repo.resolve(features)
        views = group_by_view(pairs)
        table = prepare_entities(entity_rows, [v for v, _ in views.values()], timestamp_column)
        entity_cols = [c for c in table.column_names if c != ROW]
        check_output_names(pairs, full_feature_names, entity_cols)
        for view, _ in views.values():
            self.check_source(view)
        self.con.register("__entities", table)
        ets = f"e.{q(timestamp_column)}"
        ctes, joins, select = [], [], []
        for i, (view, feats) in enumerate(views.values()):
            alias = f"v{i}"
            ctes.append(f"{alias} AS ({self.view_sql(view, feats)})")
            on = " AND ".join(f"e.{q(k)} = {alias}.{q(k)}" for k in view.join_keys)
            mine = "e.__eord" if view.created else ets
            joins.append(f"ASOF LEFT JOIN {alias} ON {on} AND {mine} >= {alias}.__ord")
            for f in feats:
                value = f"CAST({alias}.{q(f)} AS {SQL_TYPES[view.dtype(f)]})"
                if view.ttl_s:
                    us = round(view.ttl_s * 1e6)
                    value = (f"CASE WHEN {alias}.__ts >= {ets} - to_microseconds({us}) "
                             f"THEN {value} END")
                select.append(f"{value} AS {q(output_name(view, f, full_feature_names))}")
        entities = "__entities"
        if any(view.created for view, _ in views.values()):  # the entity side of the order
            entities = (f"(SELECT *, struct_pack(t := {q(timestamp_column)}, c := "
                        "'infinity'::TIMESTAMPTZ) AS __eord FROM __entities)")
        sql = (f"WITH {', '.join(ctes)} SELECT {', '.join('e.' + q(c) for c in entity_cols)}, "
               f"{', '.join(select)} FROM {entities} e {' '.join(joins)} ORDER BY e.{q(ROW)}")
        try:
            out = self.con.sql(sql).to_arrow_table()
        except duckdb.BinderException as exc:
            raise InputError(f"entity rows: a join key's type does not match the source ({exc})"
                             "; fix: give join keys the entity's declared dtype") from exc
        finally:
            self.con.unregister("__entities")
        return out
