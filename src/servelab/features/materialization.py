"""Materialization: the latest offline row per entity into the online store, and parity.

A window is ``(start, end]``: rows with ``start < event time <= end``, so that
"materialized through ``end``" means exactly what offline retrieval at ``end``
sees (at or before). Per view and entity key the latest row in the window is
written (ties: latest created time); the online store keeps it only if it is
newer than what it holds, so re-running any window, or resuming after an
interruption, is idempotent. Incremental runs start where the last finished
run of each view ended (recorded in the store's metadata after its writes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa

from servelab.errors import invalid
from servelab.features.definitions import FeatureView, Repo
from servelab.features.offline import get_historical_features
from servelab.features.offline.duckdb import DuckDBEngine, q, source_sql
from servelab.features.online import OnlineRow, OnlineStore, Status

BATCH = 5_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time(text: str | None, field_name: str) -> datetime | None:
    """An ISO-8601 time (naive means UTC), or None."""
    if text is None:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise invalid(field_name, text, "an ISO-8601 time", "write e.g. 2024-05-01T00:00:00Z"
                      ) from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def to_us(t: datetime) -> int:
    return round((t - EPOCH).total_seconds() * 1e6)


@dataclass(slots=True)
class ViewSummary:
    view: str
    start: str | None
    end: str
    rows_read: int = 0
    written: int = 0
    skipped_stale: int = 0


@dataclass(slots=True)
class MaterializeSummary:
    views: list[ViewSummary] = field(default_factory=list)

    @property
    def rows_read(self) -> int:
        return sum(v.rows_read for v in self.views)

    @property
    def written(self) -> int:
        return sum(v.written for v in self.views)

    @property
    def skipped_stale(self) -> int:
        return sum(v.skipped_stale for v in self.views)

    def to_dict(self) -> dict[str, Any]:
        return {"rows_read": self.rows_read, "written": self.written,
                "skipped_stale": self.skipped_stale, "views": [asdict(v) for v in self.views]}


def _meta_key(view: FeatureView) -> str:
    return f"materialized_through:{view.name}"


def materialize(repo: Repo, store: OnlineStore, *, start: datetime | None = None,
                end: datetime | None = None, incremental: bool = False,
                views: list[str] | None = None,
                progress: Callable[[str, int, int], object] | None = None
                ) -> MaterializeSummary:
    """Write each view's latest rows in (start, end] to the online store.

    With `incremental`, each view starts where its last finished run ended
    (from the beginning if it never ran). `end` defaults to now.
    """
    end = end or datetime.now(UTC)
    if start is not None and start >= end:
        raise invalid("--start", start.isoformat(), f"a time before --end ({end.isoformat()})",
                      "swap them or widen the window")
    chosen = [repo.views[v] for v in views] if views else list(repo.views.values())
    store.apply(chosen)
    engine = DuckDBEngine(repo)
    summary = MaterializeSummary()
    for view in chosen:
        engine.check_source(view)
        begin = start
        if incremental:
            last = store.get_meta(_meta_key(view))
            begin = parse_time(last, "materialization state") if last else None
        vs = ViewSummary(view.name, begin.isoformat() if begin else None, end.isoformat())
        window = f"__ts <= {to_us(end)}" + (f" AND __ts > {to_us(begin)}" if begin else "")
        keys = ", ".join(q(k) for k in view.join_keys)
        feats = ", ".join(q(f) for f in view.feature_names)
        created = (f"epoch_us(CAST({q(view.created)} AS TIMESTAMPTZ))" if view.created
                   else "0")
        base = (f"SELECT {keys}, epoch_us(CAST({q(view.timestamp)} AS TIMESTAMPTZ)) AS __ts, "
                f"{created} AS __cr, {feats} FROM {source_sql(view)}")
        vs.rows_read = int(engine.con.sql(
            f"SELECT count(*) FROM ({base}) WHERE {window}").fetchall()[0][0])
        latest = engine.con.sql(
            f"SELECT * FROM ({base}) WHERE {window} QUALIFY row_number() OVER "
            f"(PARTITION BY {keys} ORDER BY __ts DESC, __cr DESC) = 1").to_arrow_table()
        _write(view, latest, store, vs, progress)
        store.set_meta(_meta_key(view), end.isoformat())  # only once its rows are all in
        summary.views.append(vs)
    return summary


def _write(view: FeatureView, table: pa.Table, store: OnlineStore, vs: ViewSummary,
           progress: Callable[[str, int, int], object] | None) -> None:
    n = table.num_rows
    cols = {c: table[c].to_pylist() for c in table.column_names}
    keys = list(zip(*(cols[k] for k in view.join_keys), strict=True))
    for lo in range(0, n, BATCH):
        hi = min(n, lo + BATCH)
        rows = [OnlineRow(keys[i], cols["__ts"][i], cols["__cr"][i],
                          {f: cols[f][i] for f in view.feature_names}) for i in range(lo, hi)]
        w, s = store.write(view, rows)
        vs.written += w
        vs.skipped_stale += s
        if progress is not None:
            progress(view.name, hi, n)


@dataclass(slots=True)
class ParityReport:
    at: str
    rows_checked: int
    mismatches: dict[str, int]  # feature ref -> count
    examples: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return not any(self.mismatches.values())

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "rows_checked": self.rows_checked, "ok": self.ok,
                "mismatches": self.mismatches, "examples": self.examples}


def parity(repo: Repo, store: OnlineStore, *, at: datetime | None = None, sample: int = 200,
           seed: int = 0, views: list[str] | None = None) -> ParityReport:
    """For a sample of entity keys, the online value served at `at` against the offline
    point-in-time value at `at`. `at` defaults to where materialization last ended."""
    chosen = [repo.views[v] for v in views] if views else list(repo.views.values())
    engine = DuckDBEngine(repo)
    if at is None:
        done = [store.get_meta(_meta_key(v)) for v in chosen]
        if not all(done):
            raise invalid("parity --at", None, "a time, or views that were materialized",
                          "run `servelab features materialize` first, or pass --at")
        at = min(parse_time(d, "materialization state") for d in done if d)  # type: ignore[type-var]
    assert at is not None
    now_us = to_us(at)
    rng = np.random.default_rng(seed)
    mismatches: dict[str, int] = {}
    examples: list[dict[str, Any]] = []
    checked = 0
    for view in chosen:
        engine.check_source(view)
        keys_sql = ", ".join(q(k) for k in view.join_keys)
        keys = engine.con.sql(f"SELECT DISTINCT {keys_sql} FROM {source_sql(view)} "
                              f"ORDER BY {keys_sql}").fetchall()
        if not keys:
            continue
        pick = rng.choice(len(keys), size=min(sample, len(keys)), replace=False)
        sample_keys = [tuple(keys[i]) for i in sorted(pick)]
        entity = pa.table({**{k: [key[j] for key in sample_keys]
                              for j, k in enumerate(view.join_keys)},
                           "event_timestamp": pa.array([at] * len(sample_keys),
                                                       pa.timestamp("us", tz="UTC"))})
        feats = list(view.feature_names)
        offline = get_historical_features(repo, entity, [f"{view.name}:{f}" for f in feats],
                                          engine="duckdb", full_feature_names=True)
        online = store.read(view, sample_keys, feats, now_us)
        for i, key in enumerate(sample_keys):
            got = online[i]
            for f in feats:
                want = offline[f"{view.name}__{f}"][i].as_py()
                have = got.values[f] if got.status is Status.PRESENT else None
                ref = f"{view.name}:{f}"
                mismatches.setdefault(ref, 0)
                if not _same(want, have):
                    mismatches[ref] += 1
                    if len(examples) < 10:
                        examples.append({"feature": ref, "key": list(key), "offline": want,
                                         "online": have, "online_status": got.status.value})
        checked += len(sample_keys)
    return ParityReport(at.isoformat(), checked, mismatches, examples)


def _same(a: Any, b: Any) -> bool:
    """Equal values, or both no value. A float NaN is no value, as both online stores keep
    it (null), so it equals null. Values round-trip exactly (floats as repr): no slack."""
    if _no_value(a) or _no_value(b):
        return _no_value(a) and _no_value(b)
    return bool(a == b)


def _no_value(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v)
