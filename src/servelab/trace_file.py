"""Triton's trace file: its format, the reader and the writer, and their limits.

Triton (``--trace-config level=TIMESTAMPS`` with ``triton,file=PATH``) records, per
request, when it entered the scheduler's queue (``QUEUE_START``) and when its batch ran
on an instance (``COMPUTE_START``, ``COMPUTE_END``); with ``log_frequency`` the events go
to numbered files, PATH.0, PATH.1, .... `read_trace` reads those three timestamps
(`servelab replay-trace`, measure/replay.py). `TraceWriter` writes the same format from
servelab's gateway (`servelab serve --trace-file PATH`): one numbered file every
`every` requests and the rest when the server stops, so a killed server loses at most
one file's worth; tracing stops after `limit` requests (what the reader takes at most),
so a long-running server does not fill the disk. The writer is called from the event
loop's thread only (where answers are delivered), so it needs no lock; each file is
written to a temporary name and renamed, so a reader never sees half a file.

This module sits below both gateway/ and measure/: each imports it, neither the other.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servelab.errors import InputError, cut
from servelab.files import parse_json, read_text

MAX_TRACE_REQUESTS = 2_000_000
NEEDED = ("QUEUE_START", "COMPUTE_START", "COMPUTE_END")


@dataclass(frozen=True, slots=True, eq=False)
class TraceRequests:
    """One model's complete requests from a trace, in order of queue entry (ns)."""

    model: str
    queue_ns: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    skipped: int  # traced requests without all three timestamps (rejected, cancelled)


def read_trace(paths: list[str | Path] | list[Path], model: str | None = None
               ) -> TraceRequests:
    """The requests of `model` (or of the trace's only model) in Triton trace files: one
    file, or the numbered files Triton writes with log_frequency > 0, read together."""
    field = "TRACE"
    stamps: dict[Any, dict[str, int]] = defaultdict(dict)
    names: dict[Any, str] = {}
    if not paths:
        raise InputError(f"{field}: no file given; fix: name the trace file(s)")
    for path in paths:
        doc = parse_json(read_text(path, field, what="Triton trace (JSON)"), f"{field} = "
                         f"{cut(str(path))}")
        if not isinstance(doc, list):
            raise InputError(f"{field} = {cut(str(path))}: not a Triton trace (expected a "
                             f"JSON list of trace events, got {type(doc).__name__}); fix: "
                             "the file tritonserver writes with --trace-config "
                             "triton,file=PATH")
        _collect(doc, field, stamps, names)
    return _requests(field, stamps, names, model)


def _collect(doc: list[Any], field: str, stamps: dict[Any, dict[str, int]],
             names: dict[Any, str]) -> None:
    for i, ev in enumerate(doc):
        if not isinstance(ev, dict) or not isinstance(ev.get("id"), int | str) or isinstance(
                ev.get("id"), bool):
            raise InputError(f"{field}: event {i} is not an object with an \"id\"; fix: the "
                             "file tritonserver writes with --trace-config triton,file=PATH")
        key = ev["id"]
        if isinstance(ev.get("model_name"), str):
            names[key] = ev["model_name"]
        ts = ev.get("timestamps", [])
        if not isinstance(ts, list):
            raise InputError(f"{field}: event {i} (id {cut(str(key), 40)}): \"timestamps\" "
                             "is not a list; fix: a trace at level=TIMESTAMPS")
        for t in ts:
            if not isinstance(t, dict):
                raise InputError(f"{field}: event {i} (id {cut(str(key), 40)}): a timestamp "
                                 "is not an object; fix: a trace at level=TIMESTAMPS")
            if t.get("name") not in NEEDED:
                continue  # the others (HTTP, request, compute input/output) are not used
            ns = t.get("ns")
            if not (isinstance(ns, int) and not isinstance(ns, bool) and 0 <= ns < 1 << 62):
                raise InputError(f"{field}: event {i} (id {cut(str(key), 40)}): "
                                 f"{t['name']} ns = {cut(repr(ns), 40)}; expected an integer "
                                 "from 0 to 2^62; fix: a trace at level=TIMESTAMPS")
            stamps[key][t["name"]] = ns
        if len(stamps) > MAX_TRACE_REQUESTS:
            raise InputError(f"{field}: more than {MAX_TRACE_REQUESTS:,} traced requests; "
                             "fix: a shorter trace")


def _requests(field: str, stamps: dict[Any, dict[str, int]], names: dict[Any, str],
              model: str | None) -> TraceRequests:
    models = sorted(set(names.values()))
    if model is None:
        if len(models) > 1:
            raise InputError(f"{field}: the trace holds {len(models)} models "
                             f"({', '.join(cut(m, 40) for m in models[:5])}); "
                             "fix: choose one with --model")
        model = models[0] if models else ""
    elif model not in models:
        raise InputError(f"--model = {cut(model, 60)}: not in the trace (it holds "
                         f"{', '.join(cut(m, 40) for m in models[:5]) or 'no model names'}); "
                         "fix: one of those")
    ids = [k for k in set(stamps) | set(names) if names.get(k, "") == model]
    done = [stamps[k] for k in ids if all(n in stamps.get(k, ()) for n in NEEDED)]
    if not done:
        raise InputError(f"{field}: no request of {model or 'the model'!r} has "
                         f"{', '.join(NEEDED)}; fix: trace with --trace-config "
                         "level=TIMESTAMPS and rate=1 while the load runs")
    q = np.array([d["QUEUE_START"] for d in done], np.int64)
    s = np.array([d["COMPUTE_START"] for d in done], np.int64)
    e = np.array([d["COMPUTE_END"] for d in done], np.int64)
    if (s < q).any() or (e < s).any():
        raise InputError(f"{field}: a request's timestamps are out of order (compute before "
                         "queue, or end before start); fix: a trace from one tritonserver run")
    order = np.argsort(q, kind="stable")
    return TraceRequests(model, q[order], s[order], e[order], len(ids) - len(done))


TRACE_EVERY = 500  # requests per numbered file, as Triton's log_frequency
# ... or fewer: what has waited this long since the last file is written with the next
# request, so a reader (validate's stall fit) finds a run's requests soon after it
FLUSH_AFTER_NS = 500_000_000


class TraceWriter:
    def __init__(self, path: Path, every: int = TRACE_EVERY,
                 limit: int = MAX_TRACE_REQUESTS) -> None:
        if not 1 <= limit <= MAX_TRACE_REQUESTS:
            raise InputError(f"--trace-requests = {limit!r}: expected 1 to "
                             f"{MAX_TRACE_REQUESTS:,} (what replay-trace reads at most)")
        parent = path.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise InputError(f"--trace-file = {cut(str(path))!r}: its folder does not exist "
                             "or cannot be written; fix: choose a writable folder")
        self.path = path
        self.every = every
        self.limit = limit
        self.events: list[dict[str, Any]] = []
        self.count = 0  # requests traced
        self.files = 0  # files written
        self._since_ns: int | None = None  # the first request not yet written (its end)

    def add(self, model: str, queued_ns: int, started_ns: int, done_ns: int) -> None:
        """One answered request (monotonic nanoseconds)."""
        if self.count >= self.limit:
            return
        self.events.append({"id": self.count, "model_name": model, "timestamps": [
            {"name": "QUEUE_START", "ns": queued_ns},
            {"name": "COMPUTE_START", "ns": started_ns},
            {"name": "COMPUTE_END", "ns": done_ns}]})
        self.count += 1
        if self._since_ns is None:
            self._since_ns = done_ns
        if len(self.events) >= self.every or done_ns - self._since_ns >= FLUSH_AFTER_NS:
            self.flush()

    def flush(self) -> None:
        """Write what has been collected as the next numbered file."""
        if not self.events:
            return
        target = Path(f"{self.path}.{self.files}")
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps(self.events, separators=(",", ":")))
        tmp.replace(target)
        self.files += 1
        self.events = []
        self._since_ns = None
