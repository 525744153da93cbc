"""The served-feature log: every row the gateway served (request time, entity keys,
feature values as served, prediction), appended to Parquet files off the request path.

Rows go into a bounded queue that one writer thread drains into ``served-*.parquet``
files, rotated by rows and by age. If the writer falls behind and the queue is full,
the row is dropped and counted (``dropped``), never blocking a request. The drift and
training/serving skew checks read these files.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from servelab.errors import StoreError, cut


class ServedLog:
    """A bounded, non-blocking appender of served rows to rotated Parquet files."""

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
        self._thread = threading.Thread(target=self._drain, name="served-log", daemon=True)
        self._thread.start()

    def append(self, row: dict[str, Any]) -> None:
        """Queue one row; drop it (counted) rather than wait when the writer is behind."""
        try:
            self.q.put_nowait(row)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then stop the writer."""
        self.q.put(None)
        self._thread.join(timeout=timeout_s)

    def _drain(self) -> None:
        buf: list[dict[str, Any]] = []
        started = time.monotonic()
        while True:
            try:
                item = self.q.get(timeout=0.5)
            except queue.Empty:
                item = {}
            if item is None:
                self._flush(buf)
                return
            if item:
                buf.append(item)
            if buf and (len(buf) >= self.rows_per_file
                        or time.monotonic() - started >= self.max_file_age_s):
                self._flush(buf)
                buf = []
                started = time.monotonic()

    def _flush(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        self._seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = self.dir / f"served-{self.model}-{stamp}-{self._seq:05d}.parquet"
        table = pa.Table.from_pylist(rows)
        table = table.set_column(
            table.schema.get_field_index("request_time"), "request_time",
            table.column("request_time").cast(pa.timestamp("us", tz="UTC")))
        tmp = path.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp)
        tmp.rename(path)  # readers never see a half-written file
        self.written += len(rows)
        self.files += 1
