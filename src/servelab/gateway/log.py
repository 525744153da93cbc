"""The served-feature log: every row the gateway served (request time, entity keys,
feature values as served, prediction), kept off the request path and safe from a crash.

Rows go into a bounded queue that one writer thread drains every ``FLUSH_INTERVAL_S``
into an append-only segment, ``_served-<model>-<stamp>-<seq>.jsonl`` (one JSON object a
line, written to the OS at once, so a kill -9 loses nothing written). A segment full of
rows or old enough is compacted into ``served-<model>-<stamp>-<seq>.parquet`` (written
aside, then renamed) and deleted. A segment left by a crash is compacted when the next
log opens the folder, its torn last line dropped. The underscore keeps segments out of
a folder read as a Parquet dataset; ``read_served`` reads both.

The bound: a row reaches the file within FLUSH_INTERVAL_S plus one write of its batch
after it was queued, and rows are queued before their answer is sent; the log states
``BOUND_S``. If the writer falls behind and the queue is full, the row is dropped and
counted (``dropped``), never blocking a request. The drift and skew checks read these
files.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from servelab.errors import InputError, StoreError, cut

FLUSH_INTERVAL_S = 0.05
BOUND_S = 0.1  # a row answered this long ago is in a file, crash or not
SEGMENT_PREFIX = "_served-"


class ServedLog:
    """A bounded, non-blocking appender of served rows: a JSON-lines segment written
    every FLUSH_INTERVAL_S, compacted into rotated Parquet files."""

    def __init__(self, directory: str | Path, model: str, *, max_queue: int = 100_000,
                 rows_per_file: int = 50_000, max_file_age_s: float = 60.0) -> None:
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"--log-dir = {cut(str(directory))!r}: cannot create it "
                             f"({exc.strerror}); fix: choose a writable folder") from None
        self.model = model
        self.rows_per_file = rows_per_file
        self.max_file_age_s = max_file_age_s
        self.q: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=max_queue)
        self.dropped = 0
        self.written = 0
        self.files = 0
        self._seq = 0
        self.recovered = recover(self.dir, model)
        self._segment: Path | None = None
        self._fd = -1
        self._segment_rows = 0
        self._segment_started = 0.0
        self._thread = threading.Thread(target=self._drain, name="served-log", daemon=True)
        self._thread.start()

    def append(self, row: dict[str, Any]) -> None:
        """Queue one row; drop it (counted) rather than wait when the writer is behind."""
        try:
            self.q.put_nowait(row)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, compact the open segment, then stop the writer."""
        self.q.put(None)
        self._thread.join(timeout=timeout_s)

    def _drain(self) -> None:
        while True:
            rows: list[dict[str, Any]] = []
            deadline = time.monotonic() + FLUSH_INTERVAL_S
            stop = False
            while True:
                try:
                    item = self.q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                rows.append(item)
                if len(rows) >= 10_000:
                    break
            if rows:
                self._write(rows)
            if self._segment is not None and (
                    stop or self._segment_rows >= self.rows_per_file
                    or time.monotonic() - self._segment_started >= self.max_file_age_s):
                self._rotate()
            if stop:
                return

    def _write(self, rows: list[dict[str, Any]]) -> None:
        if self._segment is None:
            self._seq += 1
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            name = f"{SEGMENT_PREFIX}{self.model}-{stamp}-{os.getpid()}-{self._seq:05d}.jsonl"
            self._segment = self.dir / name
            self._fd = os.open(self._segment, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._segment_rows = 0
            self._segment_started = time.monotonic()
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows).encode()
        view = memoryview(data)
        while view:  # one write is whole for a regular file, but a short one is allowed
            view = view[os.write(self._fd, view):]
        self._segment_rows += len(rows)
        self.written += len(rows)

    def _rotate(self) -> None:
        assert self._segment is not None
        os.close(self._fd)
        segment, self._segment, self._fd = self._segment, None, -1
        if compact(segment):
            self.files += 1


def _parquet_for(segment: Path) -> Path:
    return segment.with_name(segment.name[1:]).with_suffix(".parquet")


def _read_segment(segment: Path) -> list[dict[str, Any]]:
    """The whole lines of a segment (a crash can leave its last line torn)."""
    rows = []
    with segment.open("rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                rows.append(json.loads(line))
            except ValueError:
                break
    return rows


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    table = pa.Table.from_pylist(rows)
    i = table.schema.get_field_index("request_time")
    if i >= 0:
        table = table.set_column(i, "request_time",
                                 table.column(i).cast(pa.timestamp("us", tz="UTC")))
    return table


def compact(segment: Path) -> bool:
    """A segment into its Parquet file (written aside, then renamed), then deleted.
    False if it held no whole row."""
    target = _parquet_for(segment)
    rows = [] if target.exists() else _read_segment(segment)  # done but not yet deleted
    if rows:
        tmp = target.with_suffix(".parquet.tmp")
        pq.write_table(_table(rows), tmp)
        os.replace(tmp, target)  # readers never see a half-written file
    segment.unlink(missing_ok=True)
    return bool(rows)


def recover(directory: Path, model: str) -> int:
    """Compact what a crashed gateway left for `model`: its segments (each to its own
    Parquet file) and no half-written Parquet. Returns the segments recovered."""
    for tmp in directory.glob(f"served-{model}-*.parquet.tmp"):
        tmp.unlink(missing_ok=True)
    segments = sorted(directory.glob(f"{SEGMENT_PREFIX}{model}-*.jsonl"))
    for seg in segments:
        compact(seg)
    return len(segments)


def read_served(directory: str | Path, what: str = "--log") -> pa.Table:
    """Every served row in a log folder: the Parquet files and the whole lines of any
    segment not yet compacted (a running or crashed gateway's)."""
    d = Path(directory)
    tables = []
    read = set()  # segments read before a writer compacted them: skip their Parquet
    for seg in sorted(d.glob(f"{SEGMENT_PREFIX}*.jsonl")) if d.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):  # compacted meanwhile: read below
            rows = _read_segment(seg)
            read.add(_parquet_for(seg).name)
            if rows:
                tables.append(_table(rows))
    files = sorted(d.glob("served-*.parquet")) if d.is_dir() else []
    tables += [pq.read_table(f) for f in files if f.name not in read]
    if not tables:
        raise InputError(f"{what} = {cut(str(directory))!r}: no served-*.parquet files; fix: "
                         "point at the gateway's --log-dir after it served some requests")
    return pa.concat_tables(tables, promote_options="default")
