"""Stable measurements, as perf_analyzer takes them.

perf_analyzer does not trust one window of load. It measures window after window at the
same load until the last three agree: the largest over the smallest of their throughput,
and of their latency (the average, or the percentile `--percentile` names), within
`--stability-percentage` (10% by default). It then reports the three windows merged, and
after `--max-trials` windows (10) without that it says "Failed to obtain stable
measurement" (triton-inference-server/perf_analyzer, `InferenceProfiler`).

servelab's `load` and `validate` take the same three flags. A window here is one open-loop
run of the step's requests (`--duration` of them) on send times of its own; the windows
are joined end to end (`joined`) into the step's result, so every figure of the step
(percentiles, errors, the server's batches) is over the three windows' requests together.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from servelab.errors import invalid
from servelab.measure.loadgen import LoadResult

STABILITY_WINDOW = 3  # windows that must agree (perf_analyzer's stability window)
MAX_TRIALS = 100  # the most windows one step may run

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Stability:
    """How a step's windows are taken: `percentage` None runs one window (no check)."""

    percentage: float | None = None
    max_trials: int = 10
    percentile: int | None = None  # None: the average latency is compared

    def __post_init__(self) -> None:
        if self.percentage is not None and not (
                math.isfinite(self.percentage) and 0 < self.percentage <= 1000):
            raise invalid("--stability-percentage", self.percentage, "a percentage above 0 "
                          "and at most 1000 (the most the largest of the last three windows "
                          "may exceed the smallest by)", "e.g. 10, perf_analyzer's default")
        if not STABILITY_WINDOW <= self.max_trials <= MAX_TRIALS:
            raise invalid("--max-trials", self.max_trials, f"{STABILITY_WINDOW} to "
                          f"{MAX_TRIALS} windows", "e.g. 10, perf_analyzer's default")
        if self.percentile is not None and not 1 <= self.percentile <= 99:
            raise invalid("--percentile", self.percentile, "a whole percentile from 1 to 99",
                          "e.g. 99, or leave it out to compare the average latency")

    @property
    def on(self) -> bool:
        return self.percentage is not None

    def latency_ms(self, r: LoadResult) -> float:
        """The latency a window is judged by: the average, or the percentile asked for."""
        lat = r.latency_ms
        if not lat.size:
            return math.nan
        return float(lat.mean() if self.percentile is None
                     else np.percentile(lat, self.percentile))

    def agree(self, per_s: Sequence[float], latency_ms: Sequence[float]) -> bool:
        """Whether the last STABILITY_WINDOW windows agree: for throughput and for latency,
        the largest over the smallest at most 1 + percentage / 100."""
        if self.percentage is None or len(per_s) < STABILITY_WINDOW:
            return False
        limit = self.percentage / 100
        return all(last_spread(xs) <= limit for xs in (per_s, latency_ms))  # (NaN: False)


def last_spread(xs: Sequence[float]) -> float:
    """How far the largest of the last STABILITY_WINDOW values is above the smallest, as
    a fraction of it; NaN where one is not a positive finite number."""
    last = xs[-STABILITY_WINDOW:]
    if not last or not all(math.isfinite(x) for x in last):  # (min and max pass a NaN by)
        return math.nan
    lo = min(last)
    return max(last) / lo - 1 if lo > 0 else math.nan


@dataclass(frozen=True, slots=True)
class Windows(Generic[T]):
    """A step's windows: the kept ones' results and what came with each (the last three,
    or the one window without a check; earlier windows are let go as the step runs, so a
    step holds at most three windows' requests), whether they agreed, and every window's
    throughput and latency."""

    results: tuple[LoadResult, ...]
    extras: tuple[T, ...]
    stable: bool | None  # None: no check asked for
    per_s: tuple[float, ...]
    latency_ms: tuple[float, ...]

    @property
    def kept(self) -> int:
        return len(self.results)

    @property
    def used(self) -> tuple[LoadResult, ...]:
        return self.results

    @property
    def used_extras(self) -> tuple[T, ...]:
        return self.extras

    def summary(self) -> dict[str, object]:
        """For the report: how many windows ran, whether the last three agreed, and each
        window's throughput and latency."""
        return {"windows": len(self.per_s), "kept": self.kept, "stable": self.stable,
                "window_per_s": [round(x, 3) for x in self.per_s],
                "window_latency_ms": [round(x, 4) for x in self.latency_ms]}


def take(window: Callable[[int], tuple[LoadResult, T]], how: Stability) -> Windows[T]:
    """Run `window(j)` for j = 0, 1, ... until the last three agree or `how.max_trials`
    ran (one window when no check is asked for)."""
    results: deque[tuple[LoadResult, T]] = deque(maxlen=STABILITY_WINDOW)
    per_s: list[float] = []
    lat: list[float] = []
    trials = how.max_trials if how.on else 1
    stable: bool | None = None
    for j in range(trials):
        res, extra = window(j)
        results.append((res, extra))
        per_s.append(float(res.summary()["achieved_per_s"]))
        lat.append(how.latency_ms(res))
        if how.on and how.agree(per_s, lat):
            stable = True
            break
    else:
        stable = False if how.on else None
    return Windows(tuple(r for r, _ in results), tuple(e for _, e in results), stable,
                   tuple(per_s), tuple(lat))


def joined(results: Sequence[LoadResult]) -> LoadResult:
    """Windows end to end, as one run: each window's clock moved on so that it starts
    where the one before it ended (its last answer), so the joined span is the windows'
    spans added and the send times never overlap; error counts added."""
    if len(results) == 1:
        return results[0]
    parts: dict[str, list[np.ndarray]] = {"intended": [], "sent": [], "done": []}
    status: list[np.ndarray] = []
    errors: dict[str, int] = {}
    at = 0
    for r in results:
        if not r.status.size:
            continue
        shift = at - int(r.intended_ns.min())
        parts["intended"].append(r.intended_ns + shift)
        parts["sent"].append(r.sent_ns + shift)
        parts["done"].append(r.done_ns + shift)
        status.append(r.status)
        at = int(max(r.done_ns.max(), r.sent_ns.max(), r.intended_ns.max())) + shift
        for k, v in r.errors.items():
            errors[k] = errors.get(k, 0) + v
    if not status:
        return results[-1]
    return LoadResult(np.concatenate(parts["intended"]), np.concatenate(parts["sent"]),
                      np.concatenate(parts["done"]), np.concatenate(status), errors)
