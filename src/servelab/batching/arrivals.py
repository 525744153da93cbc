"""Arrival processes, as integer nanoseconds from the start of the run."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numba import njit

from servelab.batching.engine import huge_block
from servelab.errors import InputError, cut, invalid
from servelab.files import read_text
from servelab.scenario import MAX_REQUESTS, MAX_SPAN_S, Arrival, Workload

NS_PER_S = 1_000_000_000

_TRACE_UNITS = {"arrival_s": 1e9, "arrival_ms": 1e6, "arrival_us": 1e3, "timestamp": 1e9}


def load_trace(path: Path, field: str = "[workload] trace_csv") -> np.ndarray:
    """Arrival times from a CSV: a column named arrival_s, arrival_ms, arrival_us or
    timestamp (seconds), or a single unnamed column of seconds. Sorted on load, and
    shifted so the first arrival is at 0 (epoch timestamps would not fit in int64 ns)."""
    text = read_text(path, field, what="CSV of arrival times")
    try:
        rows = []
        for row in csv.reader(io.StringIO(text, newline="")):
            rows.append(row)
            if len(rows) > MAX_REQUESTS + 1:
                break
    except csv.Error as exc:
        raise InputError(f"{field} = {cut(str(path))!r}: not a CSV ({exc}); "
                         "fix: one arrival time per row") from None
    if not rows:
        raise invalid(field, str(path), "at least one arrival", "add rows")
    header = [h.strip().lower() for h in rows[0]]
    col, scale, body = 0, 1e9, rows
    named = [h for h in header if h in _TRACE_UNITS]
    if named:
        col, scale, body = header.index(named[0]), _TRACE_UNITS[named[0]], rows[1:]
    else:
        try:
            float(rows[0][0])
        except (ValueError, IndexError):
            raise invalid(field, f"{path} header {rows[0]}",
                          f"a column named one of {', '.join(_TRACE_UNITS)}",
                          "rename the arrival-time column, e.g. arrival_s") from None
    try:
        t = np.array([float(r[col]) for r in body if r], dtype=np.float64)
    except (ValueError, IndexError) as exc:
        raise InputError(f"{field} = {cut(str(path))!r}: a row is not a number "
                         f"({cut(str(exc), 80)}); fix: every row needs a numeric arrival time"
                         ) from None
    if t.size == 0 or not np.all(np.isfinite(t)) or t.min() < 0:
        raise invalid(field, str(path), "finite arrival times >= 0",
                      "remove empty, negative or non-numeric rows")
    return to_ns(t * (scale / 1e9), field)


def to_ns(seconds: np.ndarray, field: str) -> np.ndarray:
    """Sorted arrival times in seconds as int64 ns from the first arrival, range-checked."""
    t = np.sort(np.asarray(seconds, dtype=np.float64))
    t = t - t[0]
    if t[-1] > MAX_SPAN_S:
        raise invalid(field, f"a trace spanning {t[-1]:.3g} s", f"at most {MAX_SPAN_S:g} s "
                      "from first to last arrival", "cut the trace, or check its time unit")
    ns: np.ndarray = np.rint(t * NS_PER_S).astype(np.int64)
    return ns


@njit(cache=True, nogil=True)
def _running_ns(gaps: np.ndarray, scale: float = 1.0, total: float = 0.0) -> float:
    """Turn gaps (times `scale` seconds) into arrival times, int64 ns written over the
    gaps' own buffer, from a running sum that starts at `total`; returns the sum at the
    end, to go on from. The same values as ``np.rint(np.cumsum(gaps * scale) * 1e9)``
    (each gap scaled with one rounding, then added in order, as cumsum does) in one pass
    and no temporary the size of the run."""
    out = gaps.view(np.int64)
    for i in range(gaps.size):
        total += gaps[i] * scale  # read before the same slot is written below
        out[i] = np.int64(np.rint(total * 1e9))
    return total


class ArrivalDraw:
    """A run's arrival times (int64 ns, sorted) in `ns`, drawn a part at a time:
    ``draw(upto)`` fills ``ns[:upto]``, so the engine can start on the first part while
    the next is drawn. Poisson gaps come from the generator in order, whatever the parts,
    so the times are those of one draw of them all; other processes are drawn whole."""

    def __init__(self, ns: np.ndarray, drawn: int,
                 rng: np.random.Generator | None = None, mean_gap_s: float = 0.0) -> None:
        self.ns = ns
        self.drawn = drawn
        self._rng = rng
        self._mean_gap_s = mean_gap_s
        self._total = 0.0

    @property
    def size(self) -> int:
        return int(self.ns.size)

    def draw(self, upto: int) -> None:
        """Arrivals up to `upto` (not past the run), after those drawn already."""
        upto = min(upto, self.ns.size)
        if upto <= self.drawn:
            return
        assert self._rng is not None
        # rng.exponential(mean_gap_s, n) to the bit: NumPy draws a standard exponential
        # and scales it, one rounding (done in the running sum)
        gaps = self.ns[self.drawn:upto].view(np.float64)
        self._rng.standard_exponential(out=gaps)
        self._total = _running_ns(gaps, self._mean_gap_s, self._total)
        self.drawn = upto


def arrival_draw(w: Workload, rng: np.random.Generator,
                 base_dir: str | Callable[[str, str], Path] | None = ".") -> ArrivalDraw:
    """The workload's arrivals, Poisson ones not drawn yet (see ArrivalDraw)."""
    if w.arrival is Arrival.POISSON:  # into huge pages (see engine.new_records)
        return ArrivalDraw(huge_block(8 * w.num_requests).view(np.int64), 0, rng,
                           1.0 / w.qps)
    ns = _drawn_whole(w, rng, base_dir)
    return ArrivalDraw(ns, ns.size)


def generate_arrivals(w: Workload, rng: np.random.Generator,
                      base_dir: str | Callable[[str, str], Path] | None = ".") -> np.ndarray:
    """Sorted arrival times in ns for the workload (the first arrival is after one gap).

    A trace starts at its first arrival. `base_dir` resolves a relative trace path, or
    is the scenario's own resolver (which applies the lab's sandbox).
    """
    arrivals = arrival_draw(w, rng, base_dir)
    arrivals.draw(arrivals.size)
    return arrivals.ns


def _drawn_whole(w: Workload, rng: np.random.Generator,
                 base_dir: str | Callable[[str, str], Path] | None) -> np.ndarray:
    n = w.num_requests
    mean_gap_s = 1.0 / w.qps
    if w.arrival is Arrival.TRACE:
        if w.arrivals_s:
            t = to_ns(np.asarray(w.arrivals_s), "[workload] arrivals_s")
        else:
            assert w.trace_csv is not None
            if callable(base_dir):
                path = base_dir(w.trace_csv, "[workload] trace_csv")
            else:
                p = Path(w.trace_csv)
                path = p if p.is_absolute() or base_dir is None else Path(base_dir) / p
            t = load_trace(path)
        trace: np.ndarray = t[:n] if n < t.size else t
        return trace
    if w.arrival is Arrival.CONSTANT:  # no running sum, so no rounding drift
        even: np.ndarray = np.rint(np.arange(1, n + 1) * (mean_gap_s * NS_PER_S))
        return even.astype(np.int64)
    # gamma with a coefficient of variation: shape 1/cv^2, same mean
    shape = 1.0 / (w.cv * w.cv)
    gaps = rng.gamma(shape, mean_gap_s / shape, n)
    _running_ns(gaps)
    out: np.ndarray = gaps.view(np.int64)
    return out
