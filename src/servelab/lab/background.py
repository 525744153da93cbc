"""Work the lab runs off the server's process: the paged-vs-contiguous replay.

The replay is seconds of Python; on a thread it would hold the interpreter lock
and slow every read-out while it runs. In one worker process (started on first
use, spawned so it shares no threads or locks with the server) it runs beside
them; at most `MAX_WAITING` replays wait, so no page can queue unbounded work.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.pool
import threading
from typing import Any

from servelab.errors import ServelabError
from servelab.llm.pool import run_paging
from servelab.scenario import Scenario

MAX_WAITING = 4

_lock = threading.Lock()
_pool: multiprocessing.pool.Pool | None = None
_slots = threading.BoundedSemaphore(MAX_WAITING)


class BusyError(ServelabError):
    """Too many replays already waiting."""


def replay(s: Scenario, requests: int, max_len: int, prefix_tokens: int,
           pool_tokens: int) -> dict[str, Any]:
    """`run_paging` in the worker process; its report as JSON-able data (no series)."""
    global _pool
    if not _slots.acquire(blocking=False):
        raise BusyError(f"paging replay: {MAX_WAITING} already waiting; fix: retry in a few "
                   "seconds")
    try:
        with _lock:
            if _pool is None:
                _pool = multiprocessing.get_context("spawn").Pool(1)
                atexit.register(stop)  # a process that exits normally ends it too
            pool = _pool
        out: dict[str, Any] = pool.apply_async(
            _replay, (s, requests, max_len, prefix_tokens, pool_tokens)).get()
        return out
    finally:
        _slots.release()


def stop() -> None:
    """End the worker process now, a replay still running with it: the lab is leaving.
    (The lab leaves with os._exit, which runs no exit handlers, so without this the
    worker would outlive it.)"""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.terminate()


def _replay(s: Scenario, requests: int, max_len: int, prefix_tokens: int,
            pool_tokens: int) -> dict[str, Any]:
    out = run_paging(s, num_requests=requests, max_len=max_len, prefix_tokens=prefix_tokens,
                     pool_tokens=pool_tokens).to_dict()
    for r in out["results"]:
        r.pop("series", None)  # the page shows averages; the CLI's --json has the series
    return out
