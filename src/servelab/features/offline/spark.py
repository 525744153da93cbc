"""The Spark offline engine (PySpark; ``local[*]`` by default, a cluster by master URL).

Per view: join entity rows to feature rows on the join keys with
``view.ts <= entity.ts`` (and, with a TTL, ``view.ts >= entity.ts - ttl``),
rank each entity row's candidates by event time then created time, keep the
first, and left-join back so unmatched rows stay. The session runs in UTC.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa

from servelab.errors import StoreError
from servelab.features.definitions import FeatureView, Repo, SourceFormat
from servelab.features.offline import (
    ENTITY_TS,
    ROW,
    arrow_type,
    check_columns,
    check_output_names,
    group_by_view,
    output_name,
    prepare_entities,
)

SPARK_TYPES = {"int64": "bigint", "int32": "int", "float64": "double", "float32": "float",
               "string": "string", "bool": "boolean"}


# Spark column types that fit each declared dtype (as DuckDB's check does).
_FITS = {
    "int64": ("tinyint", "smallint", "int", "bigint"),
    "int32": ("tinyint", "smallint", "int"),
    "float64": ("float", "double", "decimal", "tinyint", "smallint", "int", "bigint"),
    "float32": ("float", "double", "decimal", "tinyint", "smallint", "int", "bigint"),
    "string": ("string",),
    "bool": ("boolean",),
}


def check_spark_schema(view: FeatureView, dtypes: dict[str, str]) -> None:
    """The source has every one of the view's declared columns with types that fit (Spark
    would cast silently), requested or not: the same contract as the DuckDB engine's, since
    a source that lacks a declared feature is a broken definition either way."""
    check_columns(view, view.feature_names, dtypes, _FITS, ("timestamp", "date"))


class SparkEngine:
    _sessions: ClassVar[dict[str, Any]] = {}

    def __init__(self, repo: Repo, spark: Any) -> None:
        self.repo = repo
        self.spark = spark

    @classmethod
    def session(cls, master: str) -> Any:
        if master not in cls._sessions:
            try:
                from pyspark.sql import SparkSession
            except ImportError as exc:
                raise StoreError("offline engine spark: PySpark is not installed; "
                                 "fix: pip install 'servelab[spark]' (needs Java 17+)") from exc
            try:
                cls._sessions[master] = (
                    SparkSession.builder.master(master).appName("servelab")
                    .config("spark.sql.session.timeZone", "UTC")
                    .config("spark.sql.shuffle.partitions", "4")
                    .config("spark.ui.enabled", "false")
                    .config("spark.sql.execution.arrow.pyspark.enabled", "true")
                    .getOrCreate())
            except Exception as exc:  # the JVM failing to start surfaces as many types
                raise StoreError(f"[project] spark_master = {master!r}: Spark did not start "
                                 f"({exc}); fix: install Java 17+ or check the master URL"
                                 ) from exc
        return cls._sessions[master]

    @classmethod
    def shared(cls, repo: Repo) -> SparkEngine:
        return cls(repo, cls.session(repo.config.spark_master))

    def source(self, view: FeatureView) -> Any:
        s = view.source
        try:
            if s.format is SourceFormat.PARQUET:
                return self.spark.read.parquet(s.path)
            if s.format is SourceFormat.CSV:
                return self.spark.read.option("header", True).option(
                    "inferSchema", True).csv(s.path)
        except Exception as exc:
            raise StoreError(f"[views.{view.name}] source {s.path}: Spark cannot read it "
                             f"({exc}); fix: check the path and format") from exc
        import duckdb  # a DuckDB table: read it through DuckDB, hand Spark the Arrow table

        with duckdb.connect(s.path, read_only=True) as con:
            con.execute("SET enable_progress_bar = false")  # stdout is for --json
            return self.spark.createDataFrame(
                con.sql(f'SELECT * FROM "{s.table}"').to_arrow_table())

    def get_historical_features(self, entity_rows: Any, features: list[str], *,
                                full_feature_names: bool = False,
                                timestamp_column: str = ENTITY_TS) -> pa.Table:
        from pyspark.sql import Window
        from pyspark.sql import functions as F  # noqa: N812

        pairs = self.repo.resolve(features)
        views = group_by_view(pairs)
        table = prepare_entities(entity_rows, [v for v, _ in views.values()], timestamp_column)
        entity_cols = [c for c in table.column_names if c != ROW]
        check_output_names(pairs, full_feature_names, entity_cols)
        ents = self.spark.createDataFrame(table)
        result = ents.select(ROW)
        for view, feats in views.values():
            src = self.source(view)
            check_spark_schema(view, dict(src.dtypes))
            s = src.select(
                *[F.col(k).alias(f"__k_{k}") for k in view.join_keys],
                F.col(view.timestamp).cast("timestamp").alias("__ts"),
                (F.col(view.created).cast("timestamp") if view.created
                 else F.lit(None).cast("timestamp")).alias("__cr"),
                *[F.col(f).cast(SPARK_TYPES[view.dtype(f)]).alias(
                    output_name(view, f, full_feature_names)) for f in feats])
            e = ents.select(ROW, F.col(timestamp_column).alias("__ets"), *view.join_keys)
            cond = [e[k] == s[f"__k_{k}"] for k in view.join_keys] + [e["__ets"] >= s["__ts"]]
            if view.ttl_s:
                cond.append(s["__ts"] >= e["__ets"] - F.expr(
                    f"make_dt_interval(0, 0, 0, {view.ttl_s})"))
            rank = Window.partitionBy(ROW).orderBy(F.col("__ts").desc(),
                                                   F.col("__cr").desc_nulls_last())
            best = (e.join(s, cond, "inner").withColumn("__rn", F.row_number().over(rank))
                    .filter("__rn = 1")
                    .select(ROW, *[output_name(view, f, full_feature_names) for f in feats]))
            result = result.join(best, ROW, "left")
        out = ents.join(result, ROW, "left").orderBy(ROW).drop(ROW)
        try:
            arrow = out.toArrow()
        except Exception as exc:
            raise StoreError(f"offline engine spark: the query failed ({exc}); fix: check the "
                             "entity rows' join-key types against the entities' dtypes") from exc
        # Spark hands back its own types: give every column the contract's type.
        cols = []
        for name in arrow.column_names:
            col = arrow[name]
            if name == timestamp_column:
                col = col.cast(pa.timestamp("us", tz="UTC"))
            cols.append(col)
        arrow = pa.table(cols, names=arrow.column_names)
        for view, feats in views.values():
            for f in feats:
                name = output_name(view, f, full_feature_names)
                idx = arrow.column_names.index(name)
                arrow = arrow.set_column(idx, name, arrow[name].cast(arrow_type(view.dtype(f))))
        return arrow
