"""Feature-store definitions: entities, feature views, feature services, the repo config.

Declared in a repo file (``feature_repo.toml``), validated once into frozen
dataclasses. A feature is referenced as ``view:feature``; output columns are
``feature`` or, on request, ``view__feature``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import pyarrow as pa

from servelab.errors import InputError, closest, cut, invalid, unknown_key
from servelab.files import MAX_CONFIG_BYTES, parse_toml, read_text

REPO_FILE = "feature_repo.toml"

DTYPES: dict[str, pa.DataType] = {
    "int64": pa.int64(),
    "int32": pa.int32(),
    "float64": pa.float64(),
    "float32": pa.float32(),
    "string": pa.string(),
    "bool": pa.bool_(),
}


class SourceFormat(Enum):
    PARQUET = "parquet"
    CSV = "csv"
    DUCKDB = "duckdb"


@dataclass(frozen=True, slots=True)
class Source:
    """Where a view's rows live: a Parquet or CSV file (or glob), or a DuckDB table."""

    path: str  # resolved, absolute
    format: SourceFormat
    table: str | None = None  # DuckDB only


@dataclass(frozen=True, slots=True)
class Entity:
    name: str
    join_keys: tuple[str, ...]
    dtypes: tuple[tuple[str, str], ...]  # join key -> dtype name


@dataclass(frozen=True, slots=True)
class FeatureView:
    name: str
    entities: tuple[str, ...]
    join_keys: tuple[str, ...]
    key_dtypes: tuple[tuple[str, str], ...]
    source: Source
    timestamp: str
    created: str | None
    ttl_s: float | None  # None or 0: unlimited
    features: tuple[tuple[str, str], ...]  # feature -> dtype name

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(f for f, _ in self.features)

    def dtype(self, feature: str) -> str:
        for name, dtype in self.features:
            if name == feature:
                return dtype
        raise KeyError(feature)


@dataclass(frozen=True, slots=True)
class FeatureService:
    name: str
    features: tuple[str, ...]  # "view:feature" refs


@dataclass(frozen=True, slots=True)
class RepoConfig:
    name: str
    root: str
    offline: str = "duckdb"  # duckdb | spark
    spark_master: str = "local[*]"
    online: str = "sqlite"  # sqlite | redis
    sqlite_path: str = "data/online.db"
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_timeout_s: float = 2.0


@dataclass(frozen=True, slots=True)
class Repo:
    config: RepoConfig
    entities: dict[str, Entity] = field(default_factory=dict)
    views: dict[str, FeatureView] = field(default_factory=dict)
    services: dict[str, FeatureService] = field(default_factory=dict)
    # What callers derive from the definitions, kept (a repo does not change once loaded):
    # resolved refs, the online read plans. Bounded: a cache past 10,000 entries is reset.
    cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def resolve(self, refs: list[str] | tuple[str, ...]) -> list[tuple[FeatureView, str]]:
        """`view:feature` refs (or a `service:NAME`) as (view, feature) pairs, in order."""
        key = ("resolve", tuple(refs))
        hit = self.cache.get(key)
        if hit is None:
            hit = tuple(self._resolve(refs))
            if len(self.cache) > 10_000:
                self.cache.clear()
            self.cache[key] = hit
        return list(hit)

    def _resolve(self, refs: list[str] | tuple[str, ...]) -> list[tuple[FeatureView, str]]:
        out: list[tuple[FeatureView, str]] = []
        for ref in refs:
            if ref.startswith("service:"):
                name = ref.split(":", 1)[1]
                if name not in self.services:
                    raise _unknown("feature service", name, self.services)
                out += self.resolve(self.services[name].features)
                continue
            view_name, sep, feat = ref.partition(":")
            if not sep:
                raise invalid("feature", ref, "a reference view:feature",
                              f"write e.g. {next(iter(self.views), 'view')}:feature")
            if view_name not in self.views:
                raise _unknown("feature view", view_name, self.views)
            view = self.views[view_name]
            if feat not in view.feature_names:
                raise _unknown(f"feature of view {view_name!r}", feat, view.feature_names)
            out.append((view, feat))
        if not out:
            raise invalid("features", refs, "at least one view:feature",
                          "name the features to retrieve")
        return out


def _unknown(what: str, name: str, valid: Any) -> InputError:
    valid = list(valid)
    guess = closest(name, valid)
    fix = f"did you mean {guess!r}?" if guess else f"use one of {', '.join(valid) or '(none)'}"
    return InputError(f"{what} = {name!r}: not defined; expected one of "
                      f"{', '.join(valid) or '(none)'}; fix: {fix}")


def _check_keys(where: str, raw: dict[str, Any], allowed: set[str]) -> None:
    for key in raw:
        if key not in allowed:
            raise unknown_key(where, key, allowed)


MAX_TTL_S = 100 * 365 * 86_400  # a century: beyond it, leave ttl_s out (unlimited)
KEY_DTYPES = ("int32", "int64", "string")


def _key_dtype(where: str, name: str) -> str:
    """Join keys are whole numbers or strings: a float key (1.0 vs 1) or a bool key would
    not round-trip as the same stored key, so they are refused here, not lost later."""
    if name not in KEY_DTYPES:
        raise invalid(where, name, f"a join key type: one of {', '.join(KEY_DTYPES)}",
                      "use int64 (or string) keys; cast float or bool ids in the source")
    return name


def _redis_url(raw: Any) -> str:
    url = str(raw)
    if not isinstance(raw, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise invalid("[project] redis_url", raw, "a URL starting redis://, rediss:// or "
                      "unix://", 'write redis_url = "redis://127.0.0.1:6379/0"')
    return url


def _timeout(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0.01 <= raw <= 600:
        raise invalid("[project] redis_timeout_s", raw, "a number of seconds from 0.01 to 600",
                      "write redis_timeout_s = 2.0")
    return float(raw)


def _dtype(where: str, name: str) -> str:
    if name not in DTYPES:
        raise invalid(where, name, f"one of {', '.join(DTYPES)}", "use int64, float64 or string")
    return name


def _source(where: str, raw: Any, root: Path) -> Source:
    if isinstance(raw, str):
        raw = {"path": raw}
    if not isinstance(raw, dict) or "path" not in raw:
        raise invalid(where, raw, 'a path, or { path = "...", table = "..." } for DuckDB',
                      'write source = "data/user_stats.parquet"')
    _check_keys(where, raw, {"path", "format", "table"})
    path = Path(raw["path"])
    path = path if path.is_absolute() else root / path
    fmt_name = raw.get("format") or {".parquet": "parquet", ".csv": "csv", ".duckdb": "duckdb",
                                     ".db": "duckdb"}.get(path.suffix.lower())
    if fmt_name not in {f.value for f in SourceFormat}:
        raise invalid(f"{where}.format", fmt_name, "parquet, csv or duckdb",
                      "name the file .parquet/.csv/.duckdb or set format")
    fmt = SourceFormat(fmt_name)
    if fmt is SourceFormat.DUCKDB and not raw.get("table"):
        raise invalid(f"{where}.table", None, "the table to read from the DuckDB file",
                      'add table = "user_stats"')
    return Source(str(path), fmt, raw.get("table"))


def load_repo(path: str | Path) -> Repo:
    """Read and validate a feature repo (a directory holding feature_repo.toml, or the file)."""
    p = Path(path)
    try:
        file = p / REPO_FILE if p.is_dir() else p
        exists = file.exists()
    except OSError:  # a name too long, say
        exists = False
        file = p
    if not exists:
        raise invalid("--repo", str(path), f"a directory with {REPO_FILE}",
                      "run `servelab features init DIR` first, or pass --repo DIR")
    raw = parse_toml(read_text(file, "--repo", max_bytes=MAX_CONFIG_BYTES,
                               what=REPO_FILE), cut(str(file)))
    root = file.parent.resolve()
    try:
        return _repo(raw, root)
    except InputError as exc:
        raise InputError(f"{cut(str(file))}: {exc}") from None


def _repo(raw: dict[str, Any], root: Path) -> Repo:
    _check_keys("repo", raw, {"project", "entities", "views", "services"})
    proj = raw.get("project", {})
    _check_keys("[project]", proj, {"name", "offline", "spark_master", "online", "sqlite_path",
                                    "redis_url", "redis_timeout_s"})
    if proj.get("offline", "duckdb") not in ("duckdb", "spark"):
        raise invalid("[project] offline", proj["offline"], "duckdb or spark",
                      'set offline = "duckdb" (embedded) or "spark"')
    if proj.get("online", "sqlite") not in ("sqlite", "redis"):
        raise invalid("[project] online", proj["online"], "sqlite or redis",
                      'set online = "sqlite" (embedded) or "redis"')
    sqlite_path = Path(proj.get("sqlite_path", "data/online.db"))
    config = RepoConfig(
        name=str(proj.get("name", root.name)),
        root=str(root),
        offline=proj.get("offline", "duckdb"),
        spark_master=str(proj.get("spark_master", "local[*]")),
        online=proj.get("online", "sqlite"),
        sqlite_path=str(sqlite_path if sqlite_path.is_absolute() else root / sqlite_path),
        redis_url=_redis_url(proj.get("redis_url", "redis://127.0.0.1:6379/0")),
        redis_timeout_s=_timeout(proj.get("redis_timeout_s", 2.0)),
    )
    entities: dict[str, Entity] = {}
    for name, e in raw.get("entities", {}).items():
        where = f"[entities.{name}]"
        _check_keys(where, e, {"join_keys", "dtypes"})
        keys = e.get("join_keys")
        if not keys or not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise invalid(f"{where} join_keys", keys, "a list of column names",
                          'write join_keys = ["user_id"]')
        dtypes = e.get("dtypes", {})
        entities[name] = Entity(name, tuple(keys), tuple(
            (k, _key_dtype(f"{where} dtypes.{k}", dtypes.get(k, "int64"))) for k in keys))
    views: dict[str, FeatureView] = {}
    for name, v in raw.get("views", {}).items():
        where = f"[views.{name}]"
        _check_keys(where, v, {"entities", "source", "timestamp", "created", "ttl_s", "features"})
        ents = v.get("entities", [])
        if not isinstance(ents, list) or not all(isinstance(en, str) for en in ents):
            raise invalid(f"{where} entities", ents, "a list of entity names",
                          f"write entities = [{json.dumps(str(ents))}]" if isinstance(ents, str)
                          else 'write entities = ["user"]')
        for en in ents:
            if en not in entities:
                raise _unknown(f"{where} entity", en, entities)
        if not ents:
            raise invalid(f"{where} entities", ents, "at least one entity", 'entities = ["user"]')
        feats = v.get("features")
        if not isinstance(feats, dict) or not feats:
            raise invalid(f"{where} features", feats, "a table of feature -> dtype",
                          "write features = { txn_count_7d = \"int64\" }")
        ttl = v.get("ttl_s")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)
                                or not 0 <= ttl <= MAX_TTL_S):
            raise invalid(f"{where} ttl_s", ttl, "seconds >= 0 (0: unlimited)", "set ttl_s = 86400")
        join_keys = tuple(k for en in ents for k in entities[en].join_keys)
        views[name] = FeatureView(
            name=name,
            entities=tuple(ents),
            join_keys=join_keys,
            key_dtypes=tuple(kd for en in ents for kd in entities[en].dtypes),
            source=_source(f"{where} source", v.get("source"), root),
            timestamp=str(v.get("timestamp", "event_timestamp")),
            created=v.get("created"),
            ttl_s=float(ttl) if ttl else None,
            features=tuple((f, _dtype(f"{where} features.{f}", t)) for f, t in feats.items()),
        )
    repo = Repo(config, entities, views)
    for name, svc in raw.get("services", {}).items():
        _check_keys(f"[services.{name}]", svc, {"features"})
        refs = tuple(svc.get("features", []))
        repo.resolve(refs)  # validates every reference
        repo.services[name] = FeatureService(name, refs)
    return repo
