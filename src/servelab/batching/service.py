"""Service-time models: how long one batch of b rows takes on one model instance.

Every model gives the mean execution time of a batch and the throughput the
instance reaches when it is saturated, so each batch can be scored for how
well fed the GPU is: throughput at that batch size over saturated throughput.
Where FLOPs per row are known, model FLOPs utilization (MFU) is reported too.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.catalog import GpuSpec
from servelab.errors import InputError, cut, invalid
from servelab.files import read_text
from servelab.scenario import MAX_BATCH, MAX_MS, ServiceKind, ServiceModelSpec, Variability

MAX_PROFILE_BYTES = 16 * 1024 * 1024  # a profile is a few rows; perf_analyzer's CSV a few KiB


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """A batch-size -> seconds curve with its saturated throughput.

    ``curve_b`` / ``curve_s`` are the points the curve is interpolated through
    (linearly, extrapolating the end segments); analytic kinds build them
    exactly for every batch size up to the largest one asked for.
    """

    kind: ServiceKind
    name: str
    curve_b: tuple[float, ...]
    curve_s: tuple[float, ...]
    asymptote_rows_per_s: float | None  # None: no asymptote (throughput grows without bound)
    flops_per_row: float | None
    peak_flops: float | None

    def exec_s(self, batch: np.ndarray | int) -> np.ndarray:
        """Mean execution time (s) of batches of the given sizes."""
        b = np.atleast_1d(np.asarray(batch, dtype=np.float64))
        xb, ys = np.asarray(self.curve_b), np.asarray(self.curve_s)
        if xb.size == 1:
            return np.full_like(b, ys[0])
        out = np.interp(b, xb, ys)
        lo, hi = b < xb[0], b > xb[-1]
        out[lo] = ys[0] + (b[lo] - xb[0]) * (ys[1] - ys[0]) / (xb[1] - xb[0])
        out[hi] = ys[-1] + (b[hi] - xb[-1]) * (ys[-1] - ys[-2]) / (xb[-1] - xb[-2])
        # Extrapolating a measured profile downwards must not reach zero time.
        floored: np.ndarray = np.maximum(out, 1e-9)
        return floored

    def saturated_rows_per_s(self, max_batch_size: int) -> float:
        """Throughput of a saturated instance: the model's asymptote where it has one,
        else the best throughput of any allowed batch size."""
        b = np.arange(1, max_batch_size + 1, dtype=np.float64)
        best = float(np.max(b / self.exec_s(b)))
        if self.asymptote_rows_per_s is not None:
            return max(best, self.asymptote_rows_per_s)
        return best

    def feed(self, batch: np.ndarray | int, max_batch_size: int) -> np.ndarray:
        """How well fed the GPU is at each batch size: throughput / saturated throughput."""
        b = np.asarray(batch, dtype=np.float64)
        fed: np.ndarray = (b / self.exec_s(b)) / self.saturated_rows_per_s(max_batch_size)
        return fed

    def mfu(self, batch: np.ndarray | int) -> np.ndarray | None:
        """Model FLOPs utilization of a batch, where FLOPs per row are known."""
        if self.flops_per_row is None or self.peak_flops is None:
            return None
        b = np.asarray(batch, dtype=np.float64)
        return b * self.flops_per_row / (self.exec_s(b) * self.peak_flops)


def _affine(spec: ServiceModelSpec, max_b: int) -> tuple[list[float], list[float], float | None]:
    # One row per request: the per-request cost adds to the per-row slope.
    base = (spec.base_ms or 0.0) / 1e3
    per_row = ((spec.per_row_ms or 0.0) + spec.per_request_ms) / 1e3
    b = np.arange(1, max(max_b, 2) + 1, dtype=np.float64)
    asym = 1.0 / per_row if per_row > 0 else None
    return list(b), list(base + per_row * b), asym


def _roofline(spec: ServiceModelSpec, gpu: GpuSpec, max_b: int
              ) -> tuple[list[float], list[float], float | None]:
    peak = gpu.peak_flops(spec.precision) * spec.efficiency
    bw = gpu.hbm_bytes_per_s * spec.efficiency
    f_row, by_row = spec.flops_per_row or 0.0, spec.bytes_per_row or 0.0
    by_batch = spec.bytes_per_batch or 0.0
    b = np.arange(1, max(max_b, 2) + 1, dtype=np.float64)
    t = np.maximum(b * f_row / peak, (by_batch + b * by_row) / bw) + spec.overhead_us / 1e6
    per_row_s = max(f_row / peak, by_row / bw)
    return list(b), list(t), (1.0 / per_row_s if per_row_s > 0 else None)


def _csv_rows(path: Path, field: str) -> list[dict[str, str]]:
    text = read_text(path, field, max_bytes=MAX_PROFILE_BYTES, what="CSV")
    try:
        return list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise InputError(f"{field} = {cut(str(path))!r}: not a CSV ({cut(str(exc), 80)}); "
                         "fix: save it as comma-separated text") from None


def _read_simple_profile(path: Path) -> list[tuple[int, float]]:
    field = "[model] csv"
    rows = _csv_rows(path, field)
    if not rows:
        raise invalid(field, str(path), "rows of batch_size,latency_ms", "add measured rows")
    cols = {c.strip().lower(): c for c in rows[0] if c is not None}
    unit = next(((c, s) for c, s in (("latency_ms", 1.0), ("latency_us", 1e-3)) if c in cols), None)
    if "batch_size" not in cols or unit is None:
        raise invalid(field, f"{path} columns {list(rows[0])}",
                      "columns batch_size and latency_ms (or latency_us)",
                      "rename the columns, or use perf_analyzer_csv for perf_analyzer output")
    try:
        pts = [(int(r[cols["batch_size"]]), float(r[cols[unit[0]]]) * unit[1]) for r in rows]
    except (ValueError, TypeError) as exc:
        raise InputError(f"{field} = {cut(str(path))!r}: a row is not a number "
                         f"({cut(str(exc), 80)}); fix: batch_size must be whole, latency a number"
                         ) from None
    return [_checked_point(field, path, b, ms) for b, ms in pts]


def _checked_point(field: str, path: Path, b: int, ms: float) -> tuple[int, float]:
    if not (1 <= b <= MAX_BATCH and math.isfinite(ms) and 0 < ms <= MAX_MS):
        raise invalid(field, f"{cut(str(path))}: ({b}, {ms})",
                      f"batch sizes 1..{MAX_BATCH} and latencies 0 < ms <= {MAX_MS:g}",
                      "fix or remove that row")
    return b, ms


PA_COMPUTE = ("Server Compute Input", "Server Compute Infer", "Server Compute Output")


def read_perf_analyzer_csv(path: Path, field: str = "[model] perf_analyzer_csv") -> float:
    """GPU execution time (ms) of one batch from a `perf_analyzer -f` CSV: the server's
    compute input + infer + output (microseconds) at the lowest load measured (its first
    column: "Concurrency", or "Request Rate" from request-rate mode)."""
    rows = _csv_rows(path, field)
    load = next((c for c in ("Concurrency", "Request Rate") if rows and c in rows[0]),
                "Concurrency")
    missing = [c for c in (load, "Server Compute Infer") if not rows or c not in rows[0]]
    if missing:
        raise invalid(field, str(path), f"perf_analyzer -f output with columns {missing}",
                      "pass the CSV perf_analyzer wrote with -f (server-side stats included)")
    try:
        row = min(rows, key=lambda r: float(r[load]))
        us = sum(float(row[c]) for c in PA_COMPUTE if c in row and row[c] != "")
    except (ValueError, TypeError) as exc:
        raise InputError(f"{field} = {cut(str(path))!r}: a value is not a number "
                         f"({cut(str(exc), 80)}); fix: pass perf_analyzer's CSV unedited") from None
    if not (math.isfinite(us) and 0 < us <= MAX_MS * 1e3):
        raise invalid(field, str(path), "a compute time > 0", "check the server-side columns")
    return us / 1e3


def _profile(spec: ServiceModelSpec, resolve: Callable[[str, str], Path]
             ) -> tuple[list[float], list[float], None]:
    if spec.points:
        pts = list(spec.points)
    elif spec.csv:
        pts = _read_simple_profile(resolve(spec.csv, "[model] csv"))
    else:
        pts = [(b, read_perf_analyzer_csv(resolve(p, "[model] perf_analyzer_csv")))
               for b, p in spec.perf_analyzer_csv]
    pts.sort()
    sizes = [b for b, _ in pts]
    if len(set(sizes)) != len(sizes) or any(ms <= 0 for _, ms in pts) or min(sizes) < 1:
        raise invalid("[model] profile", pts, "one latency > 0 per batch size >= 1",
                      "remove repeated or non-positive rows")
    # A profile is measured per batch of b rows (perf_analyzer -b b sends one request of b
    # rows); b one-row requests also pay the per-request cost b times.
    return ([float(b) for b in sizes],
            [(ms + spec.per_request_ms * b) / 1e3 for b, ms in pts], None)


def build_service_model(spec: ServiceModelSpec, gpu: GpuSpec, max_batch_size: int,
                        base_dir: str | Callable[[str, str], Path] | None = ".") -> ServiceModel:
    """The service-time model a scenario describes, on the scenario's GPU.

    `base_dir` resolves a relative profile path, or is the scenario's own resolver
    (which applies the lab's sandbox).
    """

    def resolve(p: str, field: str) -> Path:
        if callable(base_dir):
            return base_dir(p, field)
        q = Path(p)
        return q if q.is_absolute() or base_dir is None else Path(base_dir) / q

    asym: float | None
    if spec.kind is ServiceKind.CONSTANT:
        assert spec.latency_ms is not None
        xb, ys, asym = [1.0], [spec.latency_ms / 1e3], None
    elif spec.kind is ServiceKind.AFFINE:
        xb, ys, asym = _affine(spec, max_batch_size)
    elif spec.kind is ServiceKind.PROFILE:
        xb, ys, asym = _profile(spec, resolve)
    else:
        xb, ys, asym = _roofline(spec, gpu, max_batch_size)
    precision = spec.precision if spec.kind is ServiceKind.ROOFLINE else "bf16"
    return ServiceModel(
        kind=spec.kind,
        name=spec.name or spec.kind.value,
        curve_b=tuple(xb),
        curve_s=tuple(ys),
        asymptote_rows_per_s=asym,
        flops_per_row=spec.flops_per_row,
        peak_flops=gpu.peak_flops(precision) if spec.flops_per_row else None,
    )


def exec_table_ns(model: ServiceModel, max_batch_size: int) -> np.ndarray:
    """Mean execution time in ns for batch sizes 0..max_batch_size (index 0 unused)."""
    table = np.zeros(max_batch_size + 1, dtype=np.float64)
    table[1:] = model.exec_s(np.arange(1, max_batch_size + 1)) * 1e9
    return table


def draw_multipliers(variability: Variability, cv: float, n: int,
                     rng: np.random.Generator,
                     samples: tuple[float, ...] = (), block: int = 1) -> np.ndarray:
    """Per-batch factors with mean 1 that scale the mean execution time.

    Empirical: the measured multipliers (each batch's time over the model's mean at
    its size), scaled to mean 1 so the model's mean stays the mean, and resampled
    with replacement: a measured stall comes back about as often as it was seen. With
    `block` > 1, in runs of `block` consecutive ones from a random start (wrapping
    round), so a stretch of slow batches stays together as the server ran them (a
    moving-block bootstrap).
    """
    if variability is Variability.DETERMINISTIC:
        return np.ones(n)
    if variability is Variability.EXPONENTIAL:
        return rng.exponential(1.0, n)
    if variability is Variability.EMPIRICAL:
        pool = np.asarray(samples, dtype=np.float64)
        pool = pool / pool.mean()
        if block <= 1:
            drawn: np.ndarray = rng.choice(pool, n)
            return drawn
        starts = rng.integers(0, pool.size, -(-n // block))
        runs: np.ndarray = pool[(starts[:, None] + np.arange(block)).ravel()[:n] % pool.size]
        return runs
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, 1.0 / shape, n)
