"""Per-request timestamps from the gateway, written in Triton's trace format.

`servelab serve --trace-file PATH` records, for each answered request, when it
entered the batcher's queue (``QUEUE_START``) and when its batch started and ended
on an instance (``COMPUTE_START``, ``COMPUTE_END``), the three timestamps
``servelab replay-trace`` reads from a Triton trace. Like Triton with
``log_frequency``, the events go to numbered files, PATH.0, PATH.1, ..., one every
`every` requests and the rest when the server stops, so a killed server loses at
most one file's worth. Tracing stops after `limit` requests (what replay-trace
reads at most), so a long-running server does not fill the disk.

The writer is called from the event loop's thread only (where answers are
delivered), so it needs no lock. Each file is written to a temporary name and
renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from servelab.errors import InputError, cut
from servelab.measure.triton_trace import MAX_TRACE_REQUESTS

TRACE_EVERY = 500  # requests per numbered file, as Triton's log_frequency


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

    def add(self, model: str, queued_ns: int, started_ns: int, done_ns: int) -> None:
        """One answered request (monotonic nanoseconds)."""
        if self.count >= self.limit:
            return
        self.events.append({"id": self.count, "model_name": model, "timestamps": [
            {"name": "QUEUE_START", "ns": queued_ns},
            {"name": "COMPUTE_START", "ns": started_ns},
            {"name": "COMPUTE_END", "ns": done_ns}]})
        self.count += 1
        if len(self.events) >= self.every:
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
