"""Offline retrieval: point-in-time-correct training data, one contract on every engine.

For each entity row (join keys + ``event_timestamp``) and each feature view:

* a feature row matches when its event time is at or before the entity row's
  time and, with a TTL, no older than the TTL (both bounds inclusive; no TTL
  or 0 means unlimited);
* the latest event time wins, ties go to the latest created time;
* an entity row with no match is kept, with nulls; duplicate entity rows are
  all kept; rows come back in input order;
* naive timestamps are UTC, time-zone-aware ones are converted to UTC.

(Rows tied on both event and created time for one key are duplicates; which
one wins is unspecified. The example generator never makes them.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from servelab.errors import InputError, cut, invalid
from servelab.features.definitions import DTYPES, FeatureView, Repo
from servelab.features.keys import typed_key_column

ENTITY_TS = "event_timestamp"
ROW = "__row"
UTC_US = pa.timestamp("us", tz="UTC")


def read_entity_rows(rows: Any) -> pa.Table:
    """Entity rows from a pyarrow Table, a pandas DataFrame, or a Parquet/CSV path."""
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, str | Path):
        p = Path(rows)
        try:
            is_file = p.is_file()
        except OSError:  # a name too long, say
            is_file = False
        if not is_file:
            raise invalid("--entities", str(rows), "a Parquet or CSV file that exists",
                          "check the path")
        try:
            if p.suffix.lower() == ".csv":
                import pyarrow.csv as pacsv

                return pacsv.read_csv(p)
            import pyarrow.parquet as pq

            return pq.read_table(p)
        except (pa.ArrowException, OSError) as exc:
            kind = "CSV" if p.suffix.lower() == ".csv" else "Parquet"
            raise InputError(f"--entities = {cut(str(rows))!r}: not a readable {kind} file "
                             f"({cut(str(exc), 160)}); fix: write the entity rows with "
                             "pandas/pyarrow (join keys and event_timestamp)") from None
    if hasattr(rows, "to_dict") and hasattr(rows, "columns"):  # a pandas DataFrame
        return pa.Table.from_pandas(rows, preserve_index=False)
    raise invalid("entity rows", type(rows).__name__, "a pyarrow Table, a pandas DataFrame or "
                  "a path", "pass a table with the join keys and event_timestamp")


def to_utc(col: pa.ChunkedArray | pa.Array, where: str) -> pa.ChunkedArray | pa.Array:
    """A timestamp column as timestamp[us, UTC]: naive means UTC, aware is converted.

    Times are kept to the microsecond, as feature timestamps are: a finer part is
    dropped (floored), which changes no point-in-time result, since a feature time t in
    whole microseconds is <= an entity time e exactly when it is <= floor(e)."""
    t = col.type
    if pa.types.is_timestamp(t):
        us = col.cast(pa.timestamp("us", tz=t.tz), safe=False) if t.unit == "ns" else col
        if t.tz is None:
            return pc.assume_timezone(us.cast(pa.timestamp("us")), "UTC").cast(UTC_US)
        return us.cast(UTC_US)
    if pa.types.is_date(t):
        return pc.assume_timezone(col.cast(pa.timestamp("us")), "UTC").cast(UTC_US)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        for unit_type in (pa.timestamp("ns", tz="UTC"), pa.timestamp("ns"), UTC_US,
                          pa.timestamp("us")):
            try:  # with an offset in the text, then without one (naive, so UTC)
                return to_utc(col.cast(unit_type), where)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
    raise invalid(where, str(t), "a timestamp (or ISO-8601 text)",
                  "store times as timestamps, e.g. 2024-05-01T12:00:00Z")


def prepare_entities(rows: Any, views: list[FeatureView], ts_col: str = ENTITY_TS) -> pa.Table:
    """Validate entity rows for the views asked for; add the row number that keeps order."""
    table = read_entity_rows(rows)
    if ts_col not in table.column_names:
        raise invalid("entity rows", f"columns {table.column_names}",
                      f"a {ts_col!r} column with each row's point in time",
                      f"add a {ts_col} column (timestamps; naive means UTC)")
    for view in views:
        for key in view.join_keys:
            if key not in table.column_names:
                raise invalid("entity rows", f"columns {table.column_names}",
                              f"join key {key!r}, needed by view {view.name!r}",
                              f"add a {key} column to the entity rows")
    ts = to_utc(table[ts_col], f"entity rows column {ts_col!r}")
    if ts.null_count:
        first = next(i for i, v in enumerate(ts.is_null().to_pylist()) if v)
        raise invalid(f"entity rows column {ts_col!r}", f"{ts.null_count:,} empty (NaT or "
                      f"null) times, the first in row {first}", "a point in time on every row",
                      "drop those rows or give each one its time")
    table = table.set_column(table.column_names.index(ts_col), ts_col, ts)
    typed: dict[str, str] = {}
    for view in views:
        typed.update(view.key_dtypes)
    for key, dtype in typed.items():  # the same typing as the online read's
        i = table.column_names.index(key)
        table = table.set_column(i, key, typed_key_column(key, dtype, table.column(i)))
    return table.append_column(ROW, pa.array(range(table.num_rows), pa.int64()))


def output_name(view: FeatureView, feature: str, full: bool) -> str:
    return f"{view.name}__{feature}" if full else feature


def group_by_view(pairs: list[tuple[FeatureView, str]]) -> dict[str, tuple[FeatureView, list[str]]]:
    out: dict[str, tuple[FeatureView, list[str]]] = {}
    for view, feat in pairs:
        out.setdefault(view.name, (view, []))[1].append(feat)
    return out


def check_output_names(pairs: list[tuple[FeatureView, str]], full: bool,
                       entity_cols: list[str]) -> None:
    names = [output_name(v, f, full) for v, f in pairs]
    clash = sorted({n for n in names if names.count(n) > 1} | (set(names) & set(entity_cols)))
    if clash:
        raise InputError(f"features: output columns {clash} would clash; expected unique names; "
                         "fix: ask for view__feature names (full_feature_names / --full-names)")


def check_columns(view: FeatureView, features: list[str] | tuple[str, ...],
                  column_types: dict[str, str], fits: dict[str, tuple[str, ...]],
                  time_types: tuple[str, ...]) -> None:
    """A source has the view's columns with types that fit the declared ones.

    Engines would otherwise cast quietly (Spark) or fail late (DuckDB), so each
    hands its own type names here: `fits` maps a declared dtype to the engine's
    type names that fit it, `time_types` the prefixes of its timestamp types.
    """
    where = f"[views.{view.name}] source {view.source.path}"
    need = [*view.key_dtypes, *((f, view.dtype(f)) for f in features)]
    for col, dtype in need:
        if col not in column_types:
            raise InputError(f"{where}: column {col!r} missing; expected columns "
                             f"{[c for c, _ in need] + [view.timestamp]}; fix: add it to "
                             "the source or correct the view's definition")
        if column_types[col].split("(")[0] not in fits[dtype]:
            raise InputError(f"{where}: column {col!r} has type {column_types[col]}; expected "
                             f"{dtype}; fix: cast it in the source or declare its type")
    for col in [c for c in (view.timestamp, view.created) if c is not None]:
        if col not in column_types:
            raise InputError(f"{where}: timestamp column {col!r} missing; expected one of "
                             f"{sorted(column_types)}; fix: set the view's timestamp/created "
                             "names")
        if not column_types[col].startswith(time_types):
            raise InputError(f"{where}: column {col!r} has type {column_types[col]}; expected "
                             "a timestamp; fix: store event times as timestamps")


def arrow_type(dtype: str) -> pa.DataType:
    return DTYPES[dtype]


def get_historical_features(repo: Repo, entity_rows: Any, features: list[str], *,
                            full_feature_names: bool = False, engine: str | None = None,
                            timestamp_column: str = ENTITY_TS) -> pa.Table:
    """Point-in-time-correct features for each entity row, on the repo's offline engine."""
    engine = engine or repo.config.offline
    if engine == "duckdb":
        from servelab.features.offline.duckdb import DuckDBEngine

        table = DuckDBEngine(repo).get_historical_features(
            entity_rows, features, full_feature_names=full_feature_names,
            timestamp_column=timestamp_column)
    elif engine == "spark":
        from servelab.features.offline.spark import SparkEngine

        table = SparkEngine.shared(repo).get_historical_features(
            entity_rows, features, full_feature_names=full_feature_names,
            timestamp_column=timestamp_column)
    else:
        raise invalid("engine", engine, "duckdb or spark", "use duckdb (embedded) or spark")
    return nan_as_null(table, [output_name(v, f, full_feature_names)
                               for v, f in repo.resolve(features)])


def nan_as_null(table: pa.Table, columns: list[str]) -> pa.Table:
    """A NaN feature value is no value, as the online stores keep it (SQLite NULL, Redis
    an absent field) and the gateway serves it: null in a training set too."""
    for name in columns:
        i = table.schema.get_field_index(name)
        col = table.column(i) if i >= 0 else None
        if col is not None and pa.types.is_floating(col.type) and col.length() and \
                pc.any(pc.is_nan(col)).as_py():
            table = table.set_column(i, name, pc.if_else(pc.is_nan(col), None, col))
    return table
