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
from typing import Any, Protocol

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


@dataclass(frozen=True, slots=True)
class OnlineValue:
    values: dict[str, Any]  # feature -> value (None unless present)
    status: Status
    event_ts_us: int | None


def entity_key(key: tuple[Any, ...]) -> str:
    """The stored form of a join-key tuple: compact JSON, the same on every store."""
    return json.dumps(list(key), separators=(",", ":"))


def status_of(view: FeatureView, event_ts_us: int | None, now_us: int) -> Status:
    if event_ts_us is None:
        return Status.MISSING
    if view.ttl_s and event_ts_us < now_us - round(view.ttl_s * 1e6):
        return Status.EXPIRED
    return Status.PRESENT


def decode(dtype: str, raw: Any) -> Any:
    if raw is None:
        return None
    if isinstance(raw, bytes):
        raw = raw.decode()
    if dtype.startswith("int"):
        return int(raw)
    if dtype.startswith("float"):
        return float(raw)
    if dtype == "bool":
        return raw in ("1", 1, True, "True", "true")
    return str(raw)


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
