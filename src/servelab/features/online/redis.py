"""The production online store: one Redis hash per entity and view.

Key ``{project}:{view}:{entity_key}``; fields ``_ts`` and ``_cr`` (event and
created time, microseconds) and one per feature (a null is an absent field).
Newer-wins runs in one Lua script per row, so it is atomic; a batch of rows is
one pipeline. A request's read is one round trip whatever it spans: one HMGET for
one key of one view, else one pipeline of HMGETs over every view and key. Every
socket has a timeout, so an unreachable server is a clear error, not a hang.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

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
    columns_from_rows,
    columns_given,
    converter,
    entity_key,
    oldest_valid_us,
    ttl_us,
)

# KEYS[1] = hash; ARGV = ts, created, n_set, field1, value1, ..., then fields to delete.
_NEWER_WINS = """
local cur = redis.call('HMGET', KEYS[1], '_ts', '_cr')
if cur[1] then
  local ts, cr = tonumber(cur[1]), tonumber(cur[2] or '0')
  local nts, ncr = tonumber(ARGV[1]), tonumber(ARGV[2])
  if nts < ts or (nts == ts and ncr <= cr) then return 0 end
end
local n = tonumber(ARGV[3])
local set = {'_ts', ARGV[1], '_cr', ARGV[2]}
for i = 4, 3 + 2 * n do set[#set + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(set))
if #ARGV > 3 + 2 * n then
  local del = {}
  for i = 4 + 2 * n, #ARGV do del[#del + 1] = ARGV[i] end
  redis.call('HDEL', KEYS[1], unpack(del))
end
return 1
"""


def _encode(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return repr(v) if isinstance(v, float) else str(v)


def _no_value(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v)


class RedisStore:
    def __init__(self, url: str, project: str, timeout_s: float = 2.0) -> None:
        self.url = url
        self.prefix = f"{project}:"
        self.client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s,
                                           socket_timeout=timeout_s)
        self._script = self.client.register_script(_NEWER_WINS)
        self._guard(self.client.ping)

    def _guard(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreError(f"[project] redis_url = {self.url!r}: Redis unreachable ({exc}); "
                             "fix: start redis-server or correct redis_url") from exc
        except redis.RedisError as exc:
            raise StoreError(f"online store redis {self.url}: {exc}; fix: check the server"
                             ) from exc

    def _key(self, view: FeatureView, key: tuple[Any, ...]) -> str:
        return f"{self.prefix}{view.name}:{entity_key(key)}"

    def apply(self, views: list[FeatureView]) -> None:
        self._guard(self.client.ping)  # hashes need no schema; check the server is there

    def write(self, view: FeatureView, rows: list[OnlineRow]) -> tuple[int, int]:
        pipe = self.client.pipeline(transaction=False)
        for r in rows:
            # A NaN is no value, as SQLite stores it (NULL): absent here too.
            present = [(f, v) for f, v in r.values.items() if not _no_value(v)]
            absent = [f for f, v in r.values.items() if _no_value(v)]
            args: list[Any] = [r.event_ts_us, r.created_ts_us, len(present)]
            for f, v in present:
                args += [f, _encode(v)]
            args += absent
            self._script(keys=[self._key(view, r.key)], args=args, client=pipe)
        results = self._guard(pipe.execute)
        written = sum(int(x) for x in results)
        return written, len(rows) - written

    def _hmget(self, view: FeatureView, keys: list[tuple[Any, ...]], features: Sequence[str]
               ) -> list[Any]:
        """Each key's stored event time and values, in one pipelined round trip."""
        fields = ["_ts", *features]
        prefix = f"{self.prefix}{view.name}:"
        if len(keys) == 1:  # one key: the command itself, without a pipeline's bookkeeping
            return [self._guard(self.client.hmget, prefix + entity_key(keys[0]), fields)]
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.hmget(prefix + entity_key(k), fields)
        replies: list[Any] = self._guard(pipe.execute)
        return replies

    def read(self, view: FeatureView, keys: list[tuple[Any, ...]], features: list[str],
             now_us: int) -> list[OnlineValue]:
        replies = self._hmget(view, keys, features)
        convs = [converter(view.dtype(f)) for f in features]
        oldest = oldest_valid_us(view, now_us)
        out = []
        for reply in replies:
            if reply[0] is None:
                out.append(OnlineValue(dict.fromkeys(features), Status.MISSING, None))
                continue
            ts = int(reply[0])
            if ts < oldest:
                out.append(OnlineValue(dict.fromkeys(features), Status.EXPIRED, ts))
            else:
                out.append(OnlineValue(
                    {f: None if v is None else c(v)
                     for f, c, v in zip(features, convs, reply[1:], strict=True)},
                    Status.PRESENT, ts))
        return out

    def read_columns(self, view: FeatureView, keys: list[tuple[Any, ...]], features: Sequence[str],
                     now_us: int) -> tuple[list[list[Any]], list[str]]:
        # Many keys: the statuses from the stored times, then the replies' columns as they
        # are (no row rebuilt with its time converted first).
        return self._columns(view, self._hmget(view, keys, features), features, now_us)

    def read_columns_many(self, reads: Sequence[ViewKeys], now_us: int
                          ) -> list[tuple[list[list[Any]], list[str]]]:
        """Every view's keys in one pipeline (one round trip), then each view's columns
        as `read_columns` builds them."""
        if len(reads) == 1:
            return [self.read_columns(*reads[0], now_us)]
        pipe = self.client.pipeline(transaction=False)
        for view, keys, features in reads:
            fields, prefix = ["_ts", *features], f"{self.prefix}{view.name}:"
            for key in keys:
                pipe.hmget(prefix + entity_key(key), fields)
        replies: list[Any] = self._guard(pipe.execute)
        out, at = [], 0
        for view, keys, features in reads:
            part, at = replies[at:at + len(keys)], at + len(keys)
            out.append(self._columns(view, part, features, now_us))
        return out

    def _columns(self, view: FeatureView, replies: list[Any], features: Sequence[str],
                 now_us: int) -> tuple[list[list[Any]], list[str]]:
        convs = [converter(view.dtype(f)) for f in features]
        oldest = oldest_valid_us(view, now_us)
        if len(replies) == 1:
            r = replies[0]
            return columns_from_rows([None if r[0] is None else (int(r[0]), *r[1:])], oldest,
                                     len(features), convs)
        statuses = [MISSING if r[0] is None else (EXPIRED if int(r[0]) < oldest else PRESENT)
                    for r in replies]
        return columns_given(replies, statuses, len(features), convs), statuses

    def row_reader(self, parts: Sequence[tuple[FeatureView, Sequence[str]]]
                   ) -> RowRead | None:
        """One key of each view in one round trip: one pipeline of HMGETs (one write, one
        read of every reply); None for one view, whose one-key read is one HMGET."""
        if len(parts) == 1:
            return None
        prepared = []
        for view, features in parts:
            prepared.append((f"{self.prefix}{view.name}:", ["_ts", *features],
                             [converter(view.dtype(f)) for f in features], ttl_us(view)))
        client = self.client

        def read(keys: Sequence[tuple[Any, ...]], now_us: int
                 ) -> list[tuple[Sequence[Any] | None, str]]:
            pipe = client.pipeline(transaction=False)
            for (prefix, fields, _, _), key in zip(prepared, keys, strict=True):
                pipe.hmget(prefix + entity_key(key), fields)
            replies = self._guard(pipe.execute)
            out: list[tuple[Sequence[Any] | None, str]] = []
            for (_, _, convs, ttl), reply in zip(prepared, replies, strict=True):
                if reply[0] is None:
                    out.append((None, MISSING))
                elif ttl is not None and int(reply[0]) < now_us - ttl:
                    out.append((None, EXPIRED))
                else:
                    out.append(([None if v is None else c(v)
                                 for c, v in zip(convs, reply[1:], strict=True)], PRESENT))
            return out

        return read

    def one_key_reader(self, view: FeatureView, features: Sequence[str]) -> OneKeyRead:
        fields = ["_ts", *features]
        prefix = f"{self.prefix}{view.name}:"
        convs = [converter(view.dtype(f)) for f in features]
        hmget, ttl = self.client.hmget, ttl_us(view)

        def read(key: tuple[Any, ...], now_us: int) -> tuple[Sequence[Any] | None, str]:
            reply = self._guard(hmget, prefix + entity_key(key), fields)
            if reply[0] is None:
                return None, MISSING
            if ttl is not None and int(reply[0]) < now_us - ttl:
                return None, EXPIRED
            return [None if v is None else c(v) for c, v in zip(convs, reply[1:], strict=True)
                    ], PRESENT

        return read

    def get_meta(self, name: str) -> str | None:
        v = self._guard(self.client.hget, f"{self.prefix}_meta", name)
        return None if v is None else v.decode()

    def set_meta(self, name: str, value: str) -> None:
        self._guard(self.client.hset, f"{self.prefix}_meta", name, value)

    def close(self) -> None:
        self.client.close()
