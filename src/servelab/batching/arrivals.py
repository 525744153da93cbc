"""Arrival processes, as integer nanoseconds from the start of the run."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from servelab.errors import InputError, invalid
from servelab.scenario import Arrival, Workload

NS_PER_S = 1_000_000_000

_TRACE_UNITS = {"arrival_s": 1e9, "arrival_ms": 1e6, "arrival_us": 1e3, "timestamp": 1e9}


def load_trace(path: Path) -> np.ndarray:
    """Arrival times from a CSV: a column named arrival_s, arrival_ms, arrival_us or
    timestamp (seconds), or a single unnamed column of seconds. Sorted on load."""
    try:
        with path.open(newline="") as fh:
            rows = list(csv.reader(fh))
    except OSError as exc:
        raise invalid("[workload] trace_csv", str(path), "a readable CSV file",
                      "check the path (relative paths start at the scenario file)") from exc
    if not rows:
        raise invalid("[workload] trace_csv", str(path), "at least one arrival", "add rows")
    header = [h.strip().lower() for h in rows[0]]
    col, scale, body = 0, 1e9, rows
    named = [h for h in header if h in _TRACE_UNITS]
    if named:
        col, scale, body = header.index(named[0]), _TRACE_UNITS[named[0]], rows[1:]
    else:
        try:
            float(rows[0][0])
        except (ValueError, IndexError):
            raise invalid("[workload] trace_csv", f"{path} header {rows[0]}",
                          f"a column named one of {', '.join(_TRACE_UNITS)}",
                          "rename the arrival-time column, e.g. arrival_s") from None
    try:
        t = np.array([float(r[col]) for r in body if r], dtype=np.float64)
    except (ValueError, IndexError) as exc:
        raise InputError(f"[workload] trace_csv = {str(path)!r}: a row is not a number ({exc}); "
                         "fix: every row needs a numeric arrival time") from None
    if t.size == 0 or not np.all(np.isfinite(t)) or t.min() < 0:
        raise invalid("[workload] trace_csv", str(path), "finite arrival times >= 0",
                      "remove empty, negative or non-numeric rows")
    return np.sort(np.rint(t * scale).astype(np.int64))


def generate_arrivals(w: Workload, rng: np.random.Generator, base_dir: str = ".") -> np.ndarray:
    """Sorted arrival times in ns for the workload (the first arrival is after one gap)."""
    n = w.num_requests
    mean_gap_s = 1.0 / w.qps
    if w.arrival is Arrival.TRACE:
        assert w.trace_csv is not None
        p = Path(w.trace_csv)
        t = load_trace(p if p.is_absolute() else Path(base_dir) / p)
        trace: np.ndarray = t[:n] if n < t.size else t
        return trace
    if w.arrival is Arrival.POISSON:
        gaps = rng.exponential(mean_gap_s, n)
    elif w.arrival is Arrival.CONSTANT:  # no running sum, so no rounding drift
        even: np.ndarray = np.rint(np.arange(1, n + 1) * (mean_gap_s * NS_PER_S))
        return even.astype(np.int64)
    else:  # gamma with a coefficient of variation: shape 1/cv^2, same mean
        shape = 1.0 / (w.cv * w.cv)
        gaps = rng.gamma(shape, mean_gap_s / shape, n)
    return np.rint(np.cumsum(gaps) * NS_PER_S).astype(np.int64)
